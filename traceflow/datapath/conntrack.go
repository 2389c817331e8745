package datapath

import "net/netip"

type tuple struct {
	src, dst     netip.Addr
	proto        uint8
	sport, dport uint16
}

func (t tuple) reverse() tuple { return tuple{t.dst, t.src, t.proto, t.dport, t.sport} }

func tupleOf(p *Packet) tuple {
	t := tuple{src: p.Src, dst: p.Dst, proto: p.Proto, sport: p.SrcPort, dport: p.DstPort}
	if p.Proto == ProtoICMP || p.Proto == ProtoICMPv6 {
		t.sport, t.dport = p.ICMPID, 0
	}
	return t
}

type conn struct {
	zone    uint16
	orig    tuple // as the first packet was seen
	reply   tuple // what a reply looks like, after translation
	mark    uint32
	replied bool
}

// Conntrack is one Node's connection table. It is not safe for concurrent
// use: each trace gives each Node its own.
type Conntrack struct {
	conns []*conn
	// byZone caches the connection the current packet belongs to per zone,
	// as the kernel keeps it attached to the packet between ct() calls.
	byZone map[uint16]*conn
}

// NewConntrack returns an empty table.
func NewConntrack() *Conntrack { return &Conntrack{} }

func (c *Conntrack) begin() { c.byZone = map[uint16]*conn{} }

func (c *Conntrack) find(zone uint16, t tuple) (cn *conn, reply bool) {
	for _, cn := range c.conns {
		if cn.zone != zone {
			continue
		}
		if cn.orig == t {
			return cn, false
		}
		if cn.reply == t {
			return cn, true
		}
	}
	return nil, false
}

func (c *Conntrack) run(x *execution, a Ct) {
	t := tupleOf(&x.pkt)
	cn, reply := c.byZone[a.Zone], false
	if cn == nil {
		cn, reply = c.find(a.Zone, t)
	}
	committed := cn != nil
	if cn == nil {
		cn = &conn{zone: a.Zone, orig: t, reply: t.reverse()}
	}
	if a.NAT && committed && !c.isCached(a.Zone, cn) {
		// Apply the connection's translation to a packet that just arrived.
		if reply {
			x.pkt.Src, x.pkt.Dst = cn.orig.dst, cn.orig.src
		} else {
			x.pkt.Src, x.pkt.Dst = cn.reply.dst, cn.reply.src
			if x.pkt.Proto == ProtoTCP || x.pkt.Proto == ProtoUDP || x.pkt.Proto == ProtoSCTP {
				x.pkt.SrcPort, x.pkt.DstPort = cn.reply.dport, cn.reply.sport
			}
		}
	}
	if a.Commit {
		if !committed {
			if n := a.Xlate; n != nil {
				if n.Src {
					x.pkt.Src = n.IP
					if n.Port != 0 {
						x.pkt.SrcPort = n.Port
					}
				} else {
					x.pkt.Dst = n.IP
					if n.Port != 0 {
						x.pkt.DstPort = n.Port
					}
				}
				cn.reply = tupleOf(&x.pkt).reverse()
			}
			c.conns = append(c.conns, cn)
		}
		cn.mark = cn.mark&^a.Mark.Mask | a.Mark.Value&a.Mark.Mask
	}
	if committed || a.Commit {
		c.byZone[a.Zone] = cn
	}
	state := CtTrk
	switch {
	case reply:
		state |= CtEst | CtRpl
	case cn.replied:
		state |= CtEst
	default:
		state |= CtNew // a connection stays new until a reply is seen
	}
	x.md.CtState, x.md.CtMark = state, cn.mark
	x.md.CtNwSrc, x.md.CtNwDst = cn.orig.src, cn.orig.dst
}

func (c *Conntrack) isCached(zone uint16, cn *conn) bool { return c.byZone[zone] == cn }
