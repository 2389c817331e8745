package ovscheck

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"sluice/traceflow/datapath"
)

// Sent is the packet-in OVS sent to the agent for a packet it really
// processed (packet-out), with its real connection tracking.
type Sent struct {
	Table    int
	Category uint8
	Meta     map[string]string // the packet-in's metadata (registers, tun_dst, ct_state...)
	Packet   map[string]string // the packet as it was at the controller action
	Text     string
}

var (
	packetIn2 = regexp.MustCompile(`^NXT_PACKET_IN2 \S+ \S+: (.*?) \(via `)
	userdata  = regexp.MustCompile(`^\s*userdata=([0-9a-f]+)`)
)

// monitor is an `ovs-ofctl monitor` connection that collects packet-ins.
type monitor struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	text strings.Builder
	errs strings.Builder
	done chan struct{}
}

// lockedWriter appends the monitor's stderr under its lock.
type lockedWriter struct{ m *monitor }

func (w lockedWriter) Write(p []byte) (int, error) {
	w.m.mu.Lock()
	defer w.m.mu.Unlock()
	return w.m.errs.Write(p)
}

func (m *monitor) output() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.text.String() + m.errs.String()
}

// PacketOut sends frame into the bridge at entry (the tables run from the
// first, with the real userspace datapath and its connection tracking,
// emptied first) and returns the first packet-in of category, which it
// waits for until ctx ends.
func (b *Bridge) PacketOut(ctx context.Context, entry datapath.Entry, frame []byte, category uint8) (*Sent, error) {
	if _, err := b.s.Appctl(ctx, "dpctl/flush-conntrack"); err != nil {
		return nil, err
	}
	// stdbuf: ovs-ofctl's stdout is a pipe, which stdio would buffer.
	c := exec.CommandContext(ctx, "stdbuf", "-oL", "ovs-ofctl", "-O", "OpenFlow15", "monitor", b.Name, "65534")
	c.Env, c.Dir = b.s.env, b.s.Dir
	out, err := c.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("ovscheck: %w", err)
	}
	mon := &monitor{cmd: c, done: make(chan struct{})}
	c.Stderr = lockedWriter{mon}
	if err := c.Start(); err != nil {
		return nil, fmt.Errorf("ovscheck: ovs-ofctl monitor: %w", err)
	}
	go func() {
		defer close(mon.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			mon.mu.Lock()
			mon.text.WriteString(sc.Text() + "\n")
			mon.mu.Unlock()
		}
	}()
	defer func() {
		_ = c.Process.Kill()
		<-mon.done
		_ = c.Wait()
	}()
	pkt := hex.EncodeToString(frame)
	// The monitor is listening once a probe's packet-in reaches it.
	const probe = "fe"
	if err := b.until(ctx, mon, func() error {
		_, err := b.s.Run(ctx, "", "ovs-ofctl", "-O", "OpenFlow15", "packet-out", b.Name,
			fmt.Sprintf("in_port=%d packet=%s actions=controller(userdata=%s)", entry.InPort, pkt, probe))
		return err
	}, probe); err != nil {
		return nil, err
	}
	match := fmt.Sprintf("in_port=%d", entry.InPort)
	if entry.TunDst.IsValid() {
		match += ",tun_dst=" + entry.TunDst.String()
	}
	if _, err := b.s.Run(ctx, "", "ovs-ofctl", "-O", "OpenFlow15", "packet-out", b.Name,
		fmt.Sprintf("%s packet=%s actions=resubmit(,0)", match, pkt)); err != nil {
		return nil, err
	}
	want := fmt.Sprintf("%02x", category)
	var sent *Sent
	err = b.until(ctx, mon, func() error { return nil }, want)
	if err != nil {
		return nil, err
	}
	for _, s := range parsePacketIns(mon.output()) {
		if s.Category == category {
			sent = s
			break
		}
	}
	if sent == nil {
		return nil, fmt.Errorf("ovscheck: no packet-in of category %d in:\n%s", category, mon.output())
	}
	return sent, nil
}

// until repeats act every 100ms until the monitor has seen a packet-in
// with userdata ud, or ctx ends.
func (b *Bridge) until(ctx context.Context, mon *monitor, act func() error, ud string) error {
	for {
		if err := act(); err != nil {
			return err
		}
		for _, s := range parsePacketIns(mon.output()) {
			if fmt.Sprintf("%02x", s.Category) == ud {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("ovscheck: no packet-in with userdata %s: %w; monitor saw:\n%s", ud, ctx.Err(), mon.output())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// parsePacketIns reads ovs-ofctl monitor's NXT_PACKET_IN2 messages: the
// header line with the metadata, the userdata line, the packet line.
func parsePacketIns(text string) []*Sent {
	var out []*Sent
	var cur *Sent
	for _, l := range strings.Split(text, "\n") {
		if m := packetIn2.FindStringSubmatch(l); m != nil {
			// "table_id=25 cookie=0x0 total_len=60 ct_state=...,reg1=0x4,in_port=3"
			meta := fields(strings.ReplaceAll(m[1], " ", ","))
			t := -1
			if v, ok := meta["table_id"]; ok {
				t, _ = strconv.Atoi(v)
			}
			cur = &Sent{Table: t, Meta: meta, Text: l}
			out = append(out, cur)
			continue
		}
		if cur == nil {
			continue
		}
		if m := userdata.FindStringSubmatch(l); m != nil {
			if c, err := strconv.ParseUint(m[1], 16, 8); err == nil {
				cur.Category = uint8(c)
			}
			cur.Text += "\n" + l
			continue
		}
		if cur.Packet == nil && strings.Contains(l, "dl_src=") {
			pkt, _, _ := strings.Cut(l, " ") // the checksum note follows a space
			cur.Packet = fields(pkt)
			cur.Text += "\n" + l
		}
	}
	return out
}

// ComparePacketIn lists how a real packet-in differs from the model's:
// the table, the output port chosen (reg1), the tunnel destination and
// the packet's addresses.
func ComparePacketIn(tableOf func(string) int, want *datapath.PacketIn, got *Sent) []string {
	var diffs []string
	add := func(format string, a ...any) { diffs = append(diffs, fmt.Sprintf(format, a...)) }
	if t := tableOf(want.Table); t != got.Table {
		add("packet-in table: OVS %d, model %d", got.Table, t)
	}
	if !sameValue(orZero(got.Meta["reg1"]), fmt.Sprintf("0x%x", want.Meta.Regs[1])) {
		add("reg1 (output port): OVS %s, model %d", got.Meta["reg1"], want.Meta.Regs[1])
	}
	wantTun := ""
	if want.Meta.TunDst.IsValid() {
		wantTun = want.Meta.TunDst.String()
	}
	if got.Meta["tun_dst"] != wantTun {
		add("tun_dst: OVS %q, model %q", got.Meta["tun_dst"], wantTun)
	}
	src, dst := "nw_src", "nw_dst"
	if want.Packet.IsV6() {
		src, dst = "ipv6_src", "ipv6_dst"
	}
	if got.Packet[src] != want.Packet.Src.String() || got.Packet[dst] != want.Packet.Dst.String() {
		add("packet: OVS %s=%s %s=%s, model %s -> %s", src, got.Packet[src], dst, got.Packet[dst], want.Packet.Src, want.Packet.Dst)
	}
	if !sameValue(orZero(got.Meta["pkt_mark"]), fmt.Sprintf("0x%x", want.Meta.PktMark)) {
		add("pkt_mark: OVS %s, model 0x%x", got.Meta["pkt_mark"], want.Meta.PktMark)
	}
	return diffs
}

func orZero(s string) string {
	if s == "" {
		return "0x0"
	}
	return s
}
