package aggregate

import (
	"encoding/binary"
	"math/bits"
	"math/rand/v2"
	"net/netip"

	"sluice/flow"
	"sluice/internal/bigmem"
)

// key is the correlation key of a flow: source and destination address
// (16 octets each, IPv4 in the IPv4-mapped form, as big-endian words), then
// source port, destination port, protocol and address flags in one word.
type key struct {
	src, dst [2]uint64
	rest     uint64
}

const (
	keySrcValid = 1 << iota
	keySrcIs4
	keyDstValid
	keyDstIs4
)

// addrWords returns a's words. An IPv4 address takes a path of its own
// to the IPv4-mapped form's words: As16 copies its result in one 16-octet
// move from two 8-octet stores, which defeats the processor's store
// forwarding and stalls. (Two results, not an array, so that they come
// back in registers.)
func addrWords(a netip.Addr) (hi, lo uint64) {
	if a.Is4() {
		b := a.As4()
		return 0, 0xffff<<32 | uint64(binary.BigEndian.Uint32(b[:]))
	}
	b := a.As16()
	return binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])
}

// set makes k the key of a flow (in place: a returned key would be copied
// through memory).
func (k *key) set(src, dst netip.Addr, sport, dport uint16, proto uint8) {
	var fl uint64
	k.src, k.dst = [2]uint64{}, [2]uint64{}
	if src.IsValid() {
		k.src[0], k.src[1] = addrWords(src)
		fl |= keySrcValid
		if src.Is4() {
			fl |= keySrcIs4
		}
	}
	if dst.IsValid() {
		k.dst[0], k.dst[1] = addrWords(dst)
		fl |= keyDstValid
		if dst.Is4() {
			fl |= keyDstIs4
		}
	}
	k.rest = uint64(sport)<<48 | uint64(dport)<<32 | uint64(proto)<<24 | fl
}

// eq reports whether k and o are equal, word by word (== on the struct
// calls the runtime's memequal).
func (k *key) eq(o *key) bool {
	return k.rest == o.rest && k.src[1] == o.src[1] && k.dst[1] == o.dst[1] &&
		k.src[0] == o.src[0] && k.dst[0] == o.dst[0]
}

func keyAddr(w [2]uint64, valid, is4 bool) netip.Addr {
	if !valid {
		return netip.Addr{}
	}
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], w[0])
	binary.BigEndian.PutUint64(b[8:], w[1])
	if is4 {
		return netip.AddrFrom4([4]byte(b[12:]))
	}
	return netip.AddrFrom16(b)
}

func (k *key) srcAddr() netip.Addr {
	return keyAddr(k.src, k.rest&keySrcValid != 0, k.rest&keySrcIs4 != 0)
}
func (k *key) dstAddr() netip.Addr {
	return keyAddr(k.dst, k.rest&keyDstValid != 0, k.rest&keyDstIs4 != 0)
}
func (k *key) sport() uint16 { return uint16(k.rest >> 48) }
func (k *key) dport() uint16 { return uint16(k.rest >> 32) }
func (k *key) proto() uint8  { return uint8(k.rest >> 24) }

// hashSeed keys a Store's hash function (random per Store, so that
// exporters cannot aim at collisions).
type hashSeed [6]uint64

func newHashSeed() hashSeed {
	var s hashSeed
	for i := range s {
		s[i] = rand.Uint64() | 1
	}
	return s
}

// mix is the folded 128-bit product of a and b.
func mix(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}

// hash of k: each pair of words multiplied as 128 bits, folded, keyed by
// the seed (the construction of wyhash).
func (s *hashSeed) hash(k *key) uint32 {
	h := mix(k.src[0]^s[0], k.src[1]^s[1])
	h ^= mix(k.dst[0]^s[2], k.dst[1]^s[3])
	h = mix(h^s[4], k.rest^s[5])
	return uint32(h) ^ uint32(h>>32)
}

// The interned tuples of an entry, indexes into entry.grp (see tuple).
// Addresses are interned as their 4 or 16 octets, UIDs as their 16 octets.
const (
	gSrcPod   = iota // s: namespace, name, UID, Node, Node UID
	gDstPod          // the same
	gService         // s: cluster IP, Service IP, port name, UID; w: port
	gIngress         // s: namespace, name, UID, rule; w: type, action<<8
	gEgress          // the same
	gEgressGW        // s: Egress name, IP, Node, Node UID, UID
	gMisc            // s: app protocol, HTTP values, SNAT IP, source IP; w: SNAT port, source port<<16
	nGrp
)

// Positions in the tuples above.
const (
	pNamespace, pName, pUID, pNode, pNodeUID = 0, 1, 2, 3, 4
	pClusterIP, pServiceIP, pPortName        = 0, 1, 2
	pRule                                    = 3
	pServiceUID                              = 3
	pEgressName, pEgressIP, pEgressNode      = 0, 1, 2
	pEgressNodeUID, pEgressUID               = 3, 4
	pAppProtocol, pHTTPVals, pSnatIP, pSrcIP = 0, 1, 2, 3
)

// The counters of an entry, indexes into entry.stats.
const (
	cCommon = iota
	cCommonRev
	cSrc
	cSrcRev
	cDst
	cDstRev
	nCounters
)

// Entry flags.
const (
	fLive       = 1 << iota
	fReady      // ReadyToSend: correlated, or needing no correlation
	fUpdated    // a record arrived since the last export
	fCorrFilled // the other side's Kubernetes fields are known (no look-up at export)
	fSideSrc    // the first record came from the source Node
	fSideDst    // the first record came from the destination Node
	fSrcIP      // the gMisc tuple's source IP and port replace the key's source
	fScheduled  // in a wheel bucket
)

// counter is one direction's counters of an entry: octets in 64 bits,
// packets in 32. An entry whose packet counts outgrow 32 bits (fWide) keeps
// all of them in the Store's wide table instead, at the index its first
// counter's pktTotal then holds.
type counter struct {
	octTotal, octDelta uint64
	pktTotal, pktDelta uint32
}

// entry is the state of one flow. It holds no pointers, so the slab pages
// are not scanned by the garbage collector. Times are Unix nanoseconds, 0
// for unset.
type entry struct {
	key key

	start, end     int64
	endSrc, endDst int64
	// active and inactive are the export and forget deadlines (§3.6).
	active, inactive int64

	// stats are the common, source-Node and destination-Node counters,
	// each forward and reverse; tput the matching throughputs (bit/s).
	stats [nCounters]counter
	tput  [nCounters]uint64

	present flow.Fields

	grp [nGrp]uint32 // tuptab ids
	tcp uint32       // strtab id of the TCP state

	wPrev, wNext uint32 // timing wheel bucket list
	lPrev, lNext uint32 // idle order (least recently updated first)
	bucket       uint16
	flags        uint8
	wide         bool // packet counters in Store.wide (see counter)
	retries      uint8
	endReason    uint8
	flowType     uint8
}

// wideCounters are an entry's packet counters past 32 bits: total and
// delta per counter.
type wideCounters [nCounters][2]uint64

const nilIdx = ^uint32(0)

// slab holds entries in fixed-size pages, so growing never copies and
// never leaves more than one page unused. Freed entries are reused last
// freed first; the free stack holds their indexes, so that allocating
// reads nothing from a (cold) free entry. Large pages are mapped outside
// the Go heap, in huge pages (see package bigmem and pageShift).
type slab struct {
	pages [][]entry
	next  uint32 // entries ever handed out
	free  []uint32
	mem   *bigmem.Owner
}

const (
	pageSize = 1 << pageShift
	pageMask = pageSize - 1
)

func (s *slab) at(i uint32) *entry { return &s.pages[i>>pageShift][i&pageMask] }

func (s *slab) alloc() uint32 {
	if n := len(s.free); n > 0 {
		i := s.free[n-1]
		s.free = s.free[:n-1]
		*s.at(i) = entry{}
		return i
	}
	if int(s.next>>pageShift) == len(s.pages) {
		s.pages = append(s.pages, bigmem.Make[entry](s.mem, pageSize))
	}
	i := s.next
	s.next++
	return i
}

func (s *slab) release(i uint32) {
	s.at(i).flags = 0
	s.free = append(s.free, i)
}

// index maps key hashes to slab indexes: open addressing with linear
// probing. A slot holds the 32-bit hash in its high half and index+1 in its
// low half; 0 is empty. Removal shifts the following entries back, so there
// are no tombstones.
type index struct {
	slots []uint64
	mask  uint32
	n     int
	mem   *bigmem.Owner // large slot arrays are mapped, in huge pages
}

const minIndexSlots = 1024

func (x *index) init(mem *bigmem.Owner) {
	x.mem = mem
	x.slots = bigmem.Make[uint64](mem, minIndexSlots)
	x.mask = minIndexSlots - 1
	x.n = 0
}

func (x *index) insert(h, i uint32) {
	x.insertAt(h, i, x.free(h))
}

// insertAt inserts index i, whose key hashes to h, at slot p: the first
// empty slot of h's probe run (see free).
func (x *index) insertAt(h, i, p uint32) {
	v := uint64(h)<<32 | uint64(i+1)
	if (x.n+1)*4 > len(x.slots)*3 {
		x.grow()
		x.put(v)
	} else {
		x.slots[p] = v
	}
	x.n++
}

// free is the first empty slot from h's home slot on.
func (x *index) free(h uint32) uint32 {
	p := h & x.mask
	for x.slots[p] != 0 {
		p = (p + 1) & x.mask
	}
	return p
}

func (x *index) put(v uint64) {
	x.slots[x.free(uint32(v>>32))] = v
}

func (x *index) grow() {
	old := x.slots
	x.slots = bigmem.Make[uint64](x.mem, 2*len(old))
	x.mask = uint32(len(x.slots) - 1)
	for _, v := range old {
		if v != 0 {
			x.put(v)
		}
	}
	bigmem.Free(x.mem, old)
}

// remove deletes the slot of index i, whose key hashes to h.
func (x *index) remove(h, i uint32) {
	want := uint64(h)<<32 | uint64(i+1)
	p := h & x.mask
	for x.slots[p] != want {
		if x.slots[p] == 0 {
			return // not there (cannot happen for a live entry)
		}
		p = (p + 1) & x.mask
	}
	x.n--
	// Backward shift: move later members of the probe run into the hole
	// when their home slot does not lie cyclically in (hole, their slot].
	hole := p
	for j := (hole + 1) & x.mask; ; j = (j + 1) & x.mask {
		v := x.slots[j]
		if v == 0 {
			break
		}
		home := uint32(v>>32) & x.mask
		if (j-home)&x.mask >= (j-hole)&x.mask {
			x.slots[hole] = v
			hole = j
		}
	}
	x.slots[hole] = 0
}

// stat is e's counter c.
func (s *Store) stat(e *entry, c int) flow.Stats {
	x := &e.stats[c]
	v := flow.Stats{OctetTotalCount: x.octTotal, OctetDeltaCount: x.octDelta}
	if e.wide {
		w := &s.wide[e.stats[0].pktTotal][c]
		v.PacketTotalCount, v.PacketDeltaCount = w[0], w[1]
	} else {
		v.PacketTotalCount, v.PacketDeltaCount = uint64(x.pktTotal), uint64(x.pktDelta)
	}
	return v
}

// setStat makes v e's counter c, moving e's packet counters to the wide
// table when v's do not fit in 32 bits.
func (s *Store) setStat(e *entry, c int, v flow.Stats) {
	x := &e.stats[c]
	x.octTotal, x.octDelta = v.OctetTotalCount, v.OctetDeltaCount
	if !e.wide {
		if (v.PacketTotalCount|v.PacketDeltaCount)>>32 == 0 {
			x.pktTotal, x.pktDelta = uint32(v.PacketTotalCount), uint32(v.PacketDeltaCount)
			return
		}
		s.widen(e)
	}
	w := &s.wide[e.stats[0].pktTotal][c]
	w[0], w[1] = v.PacketTotalCount, v.PacketDeltaCount
}

// widen moves e's packet counters to the wide table.
func (s *Store) widen(e *entry) {
	var w wideCounters
	for c := range e.stats {
		w[c] = [2]uint64{uint64(e.stats[c].pktTotal), uint64(e.stats[c].pktDelta)}
		e.stats[c].pktTotal, e.stats[c].pktDelta = 0, 0
	}
	var at uint32
	if n := len(s.wideFree); n > 0 {
		at = s.wideFree[n-1]
		s.wideFree = s.wideFree[:n-1]
		s.wide[at] = w
	} else {
		at = uint32(len(s.wide))
		s.wide = append(s.wide, w)
	}
	e.stats[0].pktTotal = at
	e.wide = true
}

// clearDeltas zeroes e's delta counters (after an export).
func (s *Store) clearDeltas(e *entry) {
	for c := range e.stats {
		e.stats[c].octDelta, e.stats[c].pktDelta = 0, 0
	}
	if e.wide {
		w := &s.wide[e.stats[0].pktTotal]
		for c := range w {
			w[c][1] = 0
		}
	}
}

// narrowRelease gives e's wide counters back (e is being forgotten).
func (s *Store) narrowRelease(e *entry) {
	if e.wide {
		s.wideFree = append(s.wideFree, e.stats[0].pktTotal)
		e.wide = false
	}
}
