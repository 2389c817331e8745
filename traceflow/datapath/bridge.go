package datapath

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"net/netip"
	"sort"
	"strings"
)

// Flow is one prioritised match/action entry of a table.
type Flow struct {
	Table    string
	Priority int
	Match    Match
	Actions  []Action
}

// String prints the flow as `ovs-ofctl dump-flows` would, without counters.
func (f *Flow) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "table=%s, priority=%d", f.Table, f.Priority)
	if m := f.Match.String(); m != "" {
		b.WriteString("," + m)
	}
	b.WriteString(" actions=")
	if len(f.Actions) == 0 {
		b.WriteString("drop")
	}
	for i, a := range f.Actions {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(a.String())
	}
	return b.String()
}

func (f *Flow) conjunctions() []Conjunction {
	var out []Conjunction
	for _, a := range f.Actions {
		if c, ok := a.(Conjunction); ok {
			out = append(out, c)
		}
	}
	return out
}

// Table is one stage of the pipeline.
type Table struct {
	ID    int
	Name  string
	flows []*Flow // by priority, highest first; insertion order within one
	index map[string]*Flow
}

// Group is a select group.
type Group struct {
	ID      uint32
	Buckets [][]Action
}

// String prints the group as `ovs-ofctl dump-groups` does.
func (g *Group) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "group_id=%d,type=select", g.ID)
	for i, bk := range g.Buckets {
		fmt.Fprintf(&b, ",bucket=bucket_id:%d,weight:100,actions=", i)
		for j, a := range bk {
			if j > 0 {
				b.WriteByte(',')
			}
			b.WriteString(a.String())
		}
	}
	return b.String()
}

// Bridge is one Node's switch: ordered tables and groups. It is built once
// and only read while packets run, so traces may share it.
type Bridge struct {
	Name   string
	tables []*Table
	byName map[string]*Table
	groups map[uint32]*Group
}

// NewBridge makes a bridge whose tables come in the given pipeline order.
func NewBridge(name string, tables []string) *Bridge {
	b := &Bridge{Name: name, byName: map[string]*Table{}, groups: map[uint32]*Group{}}
	for i, t := range tables {
		tb := &Table{ID: i, Name: t, index: map[string]*Flow{}}
		b.tables = append(b.tables, tb)
		b.byName[t] = tb
	}
	return b
}

// Tables returns the table names in pipeline order.
func (b *Bridge) Tables() []string {
	out := make([]string, len(b.tables))
	for i, t := range b.tables {
		out[i] = t.Name
	}
	return out
}

// Add installs a flow. A flow with the same table, priority and match as
// an existing one merges its conjunction actions into it (as OVS does for
// clauses of several conjunctions); any other duplicate is an error.
func (b *Bridge) Add(f *Flow) error {
	t := b.byName[f.Table]
	if t == nil {
		return fmt.Errorf("bridge %s: flow for unknown table %q", b.Name, f.Table)
	}
	key := fmt.Sprintf("%d|%s", f.Priority, f.Match.String())
	if old := t.index[key]; old != nil {
		if len(old.conjunctions()) == len(old.Actions) && len(f.conjunctions()) == len(f.Actions) {
			old.Actions = append(old.Actions, f.Actions...)
			return nil
		}
		return fmt.Errorf("bridge %s: duplicate flow %s", b.Name, f)
	}
	t.index[key] = f
	i := sort.Search(len(t.flows), func(i int) bool { return t.flows[i].Priority < f.Priority })
	t.flows = append(t.flows, nil)
	copy(t.flows[i+1:], t.flows[i:])
	t.flows[i] = f
	return nil
}

// AddGroup installs a group.
func (b *Bridge) AddGroup(g *Group) error {
	if _, dup := b.groups[g.ID]; dup {
		return fmt.Errorf("bridge %s: duplicate group %d", b.Name, g.ID)
	}
	b.groups[g.ID] = g
	return nil
}

// Flows returns every flow in table order, then priority order.
func (b *Bridge) Flows() []*Flow {
	var out []*Flow
	for _, t := range b.tables {
		out = append(out, t.flows...)
	}
	return out
}

// Groups returns the groups by ID.
func (b *Bridge) Groups() []*Group {
	out := make([]*Group, 0, len(b.groups))
	for _, g := range b.groups {
		out = append(out, g)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// lookup finds the flow that handles the packet in table t, resolving
// conjunctive matches at each priority level.
func (t *Table) lookup(p *Packet, md *Metadata) *Flow {
	for i := 0; i < len(t.flows); {
		prio := t.flows[i].Priority
		j := i
		for j < len(t.flows) && t.flows[j].Priority == prio {
			j++
		}
		level := t.flows[i:j]
		i = j
		var direct *Flow
		clauses := map[uint32]uint64{} // conj ID -> clause bits seen
		need := map[uint32]uint8{}
		saved := md.ConjID
		md.ConjID = 0
		for _, f := range level {
			if f.Match.ConjID != 0 || !f.Match.matches(p, md) {
				continue
			}
			conj := f.conjunctions()
			if len(conj) == 0 {
				if direct == nil {
					direct = f
				}
				continue
			}
			for _, c := range conj {
				if c.K >= 1 && c.K <= 64 {
					clauses[c.ID] |= 1 << (c.K - 1)
				}
				need[c.ID] = c.N
			}
		}
		if direct != nil {
			md.ConjID = saved
			return direct
		}
		var done []uint32
		for id, bits := range clauses {
			n := need[id]
			if n >= 1 && n <= 64 && bits == uint64(1)<<n-1 {
				done = append(done, id)
			}
		}
		sort.Slice(done, func(a, b int) bool { return done[a] < done[b] })
		for _, id := range done {
			md.ConjID = id
			for _, f := range level {
				if f.Match.ConjID == id && f.Match.matches(p, md) {
					return f
				}
			}
		}
		md.ConjID = saved
	}
	return nil
}

// Entry says where a packet enters the bridge.
type Entry struct {
	InPort uint32
	TunDst netip.Addr // set when it arrives through the tunnel port
}

// Step is one table visit.
type Step struct {
	Table string
	Flow  string // "" on a table miss
}

// Output is a packet leaving through a port.
type Output struct {
	Port   uint32
	Packet Packet
	Meta   Metadata
}

// PacketIn is a copy sent to the agent, with the state at that point.
type PacketIn struct {
	Category uint8
	Table    string
	Packet   Packet
	Meta     Metadata
}

// Result is everything that happened to one packet in one bridge.
type Result struct {
	Trail     []Step
	PacketIns []PacketIn
	Outputs   []Output
	Dropped   bool   // by a drop action, a table miss or TTL expiry
	DropTable string // where it was dropped
}

// maxSteps bounds table visits; the forward-only rule already guarantees
// termination, this only bounds the work of a pathological table set.
const maxSteps = 256

// ErrBackwardJump reports a jump to a table that is not later.
var ErrBackwardJump = errors.New("jump to an earlier table")

type execution struct {
	br      *Bridge
	ct      *Conntrack
	pkt     Packet
	md      Metadata
	cur     *Table
	next    *Table
	dropped bool
	res     *Result
}

func (x *execution) jump(name string) error {
	t := x.br.byName[name]
	if t == nil {
		return fmt.Errorf("jump to unknown table %q", name)
	}
	if t.ID <= x.cur.ID {
		return fmt.Errorf("%w: %s to %s", ErrBackwardJump, x.cur.Name, name)
	}
	x.next = t
	return nil
}

func (x *execution) output(port uint32) error {
	x.res.Outputs = append(x.res.Outputs, Output{Port: port, Packet: x.pkt, Meta: x.md})
	return nil
}

func (x *execution) packetIn(cat uint8) {
	x.res.PacketIns = append(x.res.PacketIns, PacketIn{Category: cat, Table: x.cur.Name, Packet: x.pkt, Meta: x.md})
}

// Run sends one frame into the bridge at entry and runs it through the
// tables from the first. ct holds the Node's connections (it may be fresh).
func (b *Bridge) Run(ctx context.Context, frame []byte, in Entry, ct *Conntrack) (*Result, error) {
	pkt, err := ParsePacket(frame)
	if err != nil {
		return nil, fmt.Errorf("bridge %s: %w", b.Name, err)
	}
	if len(b.tables) == 0 {
		return nil, fmt.Errorf("bridge %s has no tables", b.Name)
	}
	if ct == nil {
		ct = NewConntrack()
	}
	x := &execution{br: b, ct: ct, pkt: pkt, res: &Result{}}
	x.md.InPort, x.md.TunDst = in.InPort, in.TunDst
	x.ct.begin()
	x.cur = b.tables[0]
	for steps := 0; ; steps++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if steps == maxSteps {
			return nil, fmt.Errorf("bridge %s: more than %d table visits", b.Name, maxSteps)
		}
		f := x.cur.lookup(&x.pkt, &x.md)
		if f == nil {
			x.res.Trail = append(x.res.Trail, Step{Table: x.cur.Name})
			x.res.Dropped, x.res.DropTable = true, x.cur.Name
			return x.res, nil
		}
		x.res.Trail = append(x.res.Trail, Step{Table: x.cur.Name, Flow: f.String()})
		x.next = nil
		for _, a := range f.Actions {
			if err := a.apply(x); err != nil {
				return nil, fmt.Errorf("bridge %s: %s: %w", b.Name, f, err)
			}
			if x.dropped {
				break
			}
		}
		if x.dropped {
			x.res.Dropped, x.res.DropTable = true, x.cur.Name
			return x.res, nil
		}
		if x.next == nil {
			return x.res, nil
		}
		x.cur = x.next
	}
}

func (p *Packet) hash() uint64 {
	h := fnv.New64a()
	h.Write(p.Src.AsSlice())
	h.Write(p.Dst.AsSlice())
	h.Write([]byte{p.Proto, byte(p.SrcPort >> 8), byte(p.SrcPort), byte(p.DstPort >> 8), byte(p.DstPort)})
	return h.Sum64()
}
