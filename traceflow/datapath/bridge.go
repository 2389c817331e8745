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
	// HardTimeout is the seconds a learned flow lives (0: forever).
	HardTimeout int
	Match       Match
	Actions     []Action
}

// String prints the flow as `ovs-ofctl dump-flows` would, without counters.
func (f *Flow) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "table=%s, ", f.Table)
	if f.HardTimeout != 0 {
		fmt.Fprintf(&b, "hard_timeout=%d, ", f.HardTimeout)
	}
	fmt.Fprintf(&b, "priority=%d", f.Priority)
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
	// Learned are the flows the packet's learn actions install (OVS adds
	// them to the bridge; the model leaves that to the caller).
	Learned []*Flow
}

// maxSteps bounds table visits; the forward-only rule of goto_table
// and the resubmit depth already guarantee termination, this only bounds
// the work of a pathological table set.
const maxSteps = 256

// maxResubmitDepth is how deeply resubmits may nest (OVS's own limit).
const maxResubmitDepth = 64

// ErrBackwardJump reports a jump to a table that is not later.
var ErrBackwardJump = errors.New("jump to an earlier table")

// ErrAfterStop reports an action that would run after the packet was
// dropped or forked to conntrack (ct with table=) in a resubmitted table:
// OVS would go on with the untracked packet, which the model does not do.
var ErrAfterStop = errors.New("action after a drop or a forking ct()")

type execution struct {
	ctx     context.Context
	br      *Bridge
	ct      *Conntrack
	pkt     Packet
	md      Metadata
	cur     *Table // the table whose flow is running
	next    *Table // goto_table target of the running flow
	recirc  *Table // ct(table=) target: the pipeline resumes there
	depth   int    // resubmit nesting
	steps   int
	dropped bool
	dropAt  int // the resubmit depth of the drop
	res     *Result
}

func (x *execution) drop() { x.dropped, x.dropAt = true, x.depth }

func (x *execution) table(name string) (*Table, error) {
	t := x.br.byName[name]
	if t == nil {
		return nil, fmt.Errorf("jump to unknown table %q", name)
	}
	return t, nil
}

func (x *execution) jump(name string) error {
	t, err := x.table(name)
	if err != nil {
		return err
	}
	if t.ID <= x.cur.ID {
		return fmt.Errorf("%w: %s to %s", ErrBackwardJump, x.cur.Name, name)
	}
	x.next = t
	return nil
}

// fork sends the packet through conntrack's recirculation: once the
// current actions end, the pipeline resumes at table name.
func (x *execution) fork(name string) error {
	t, err := x.table(name)
	if err != nil {
		return err
	}
	if t.ID <= x.cur.ID {
		return fmt.Errorf("%w: %s to %s", ErrBackwardJump, x.cur.Name, name)
	}
	x.recirc = t
	return nil
}

func (x *execution) stopped() bool { return x.dropped || x.recirc != nil }

// resubmit runs table name as a nested lookup, as OVS's resubmit does:
// its flow's actions (and their goto_table chain) run, then the caller's
// remaining actions. A miss there does nothing.
func (x *execution) resubmit(name string) error {
	t, err := x.table(name)
	if err != nil {
		return err
	}
	if x.depth >= maxResubmitDepth {
		return fmt.Errorf("resubmits nested more than %d deep", maxResubmitDepth)
	}
	cur, next := x.cur, x.next
	x.depth++
	err = x.runFrom(t)
	x.depth--
	x.cur, x.next = cur, next
	return err
}

// runFrom looks the packet up in t and follows goto_table until a flow
// ends without one, the packet is dropped, or it forks to conntrack.
func (x *execution) runFrom(t *Table) error {
	for first := true; ; first = false {
		if err := x.ctx.Err(); err != nil {
			return err
		}
		if x.steps == maxSteps {
			return fmt.Errorf("bridge %s: more than %d table visits", x.br.Name, maxSteps)
		}
		x.steps++
		x.cur = t
		f := t.lookup(&x.pkt, &x.md)
		if f == nil {
			x.res.Trail = append(x.res.Trail, Step{Table: t.Name})
			if x.depth == 0 || !first {
				// A miss drops (the table-miss of OpenFlow 1.3 and
				// later), but a miss of the table a resubmit
				// looked up only returns to the caller.
				x.drop()
				x.res.DropTable = t.Name
			}
			return nil
		}
		x.res.Trail = append(x.res.Trail, Step{Table: t.Name, Flow: f.String()})
		x.next = nil
		if err := x.apply(f.Actions); err != nil {
			return fmt.Errorf("bridge %s: %s: %w", x.br.Name, f, err)
		}
		if x.dropped && x.res.DropTable == "" {
			x.res.DropTable = t.Name
		}
		if x.stopped() || x.next == nil {
			return nil
		}
		t = x.next
	}
}

// apply runs a list of actions (a flow's, or a group bucket's). A drop
// (dec_ttl at zero) ends its own list.
func (x *execution) apply(acts []Action) error {
	for _, a := range acts {
		if x.dropped && x.dropAt == x.depth && x.recirc == nil {
			break
		}
		if x.stopped() {
			return fmt.Errorf("%w: %s", ErrAfterStop, a)
		}
		if err := a.apply(x); err != nil {
			return err
		}
	}
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
// The bridge is not changed: flows the packet learns are in the result.
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
	x := &execution{ctx: ctx, br: b, ct: ct, pkt: pkt, res: &Result{}}
	x.md.InPort, x.md.TunDst = in.InPort, in.TunDst
	x.ct.begin()
	t := b.tables[0]
	for {
		x.recirc = nil
		if err := x.runFrom(t); err != nil {
			return nil, err
		}
		if x.dropped {
			x.res.Dropped = true
			return x.res, nil
		}
		if x.recirc == nil {
			return x.res, nil
		}
		t = x.recirc
	}
}

func (p *Packet) hash() uint64 {
	h := fnv.New64a()
	h.Write(p.Src.AsSlice())
	h.Write(p.Dst.AsSlice())
	h.Write([]byte{p.Proto, byte(p.SrcPort >> 8), byte(p.SrcPort), byte(p.DstPort >> 8), byte(p.DstPort)})
	return h.Sum64()
}
