package ovscheck

import (
	"context"
	"encoding/hex"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"sluice/traceflow/datapath"
)

// PacketIn is a controller action OVS ran: the category in its userdata
// and the table it ran in.
type PacketIn struct {
	Category uint8
	Table    int
}

// Result is what ofproto/trace reports for one packet.
type Result struct {
	Tables    []int    // every table visited, in order, across recirculations
	Outputs   []uint32 // ports the packet left through
	PacketIns []PacketIn
	Dropped   bool
	DropTable int               // the table that dropped it, when Dropped
	Final     map[string]string // the last "Final flow" fields
	Text      string            // the whole trace, for failure messages
}

var (
	tableLine  = regexp.MustCompile(`^(\d+)\. (.*)$`)
	outputPort = regexp.MustCompile(`^-> output port is (\d+)`)
	outputN    = regexp.MustCompile(`^output:(\d+)$`)
	controller = regexp.MustCompile(`^controller\(.*userdata=([0-9a-f]{2})`)
)

// ctNext is how many --ct-next states a trace passes: every ct() the
// model runs sees a connection that is new (each trace starts from an
// empty connection table), as OVS's default also assumes.
const ctNext = 8

// Trace runs ofproto/trace for frame entering at entry.
func (b *Bridge) Trace(ctx context.Context, entry datapath.Entry, frame []byte) (*Result, error) {
	flow := fmt.Sprintf("in_port=%d", entry.InPort)
	if entry.TunDst.IsValid() {
		if entry.TunDst.Is6() {
			flow += ",tun_ipv6_dst=" + entry.TunDst.String()
		} else {
			flow += ",tun_dst=" + entry.TunDst.String()
		}
	}
	args := []string{"ofproto/trace", b.Name, flow, hex.EncodeToString(frame)}
	for range ctNext {
		args = append(args, "--ct-next", "trk,new")
	}
	out, err := b.s.Appctl(ctx, args...)
	if err != nil {
		return nil, err
	}
	return ParseTrace(out, entry.InPort)
}

// ParseTrace reads ofproto/trace output. inPort is the packet's ingress
// port, where the in_port action sends it.
func ParseTrace(out string, inPort uint32) (*Result, error) {
	r := &Result{Text: out, DropTable: -1}
	cur, dropAt := -1, -1
	for _, raw := range strings.Split(out, "\n") {
		l := strings.TrimSpace(raw)
		if m := tableLine.FindStringSubmatch(l); m != nil && !strings.HasPrefix(raw, "Flow:") {
			t, err := strconv.Atoi(m[1])
			if err != nil {
				return nil, fmt.Errorf("ovscheck: trace line %q: %w", l, err)
			}
			cur = t
			r.Tables = append(r.Tables, t)
			if strings.HasPrefix(m[2], "No match") {
				dropAt = len(r.Tables) - 1
			}
			continue
		}
		switch {
		case l == "drop":
			dropAt = len(r.Tables) - 1
		case l == "in_port" || l == "IN_PORT":
			r.Outputs = append(r.Outputs, inPort)
		case strings.Contains(l, "skipping output to input port") && len(r.Outputs) > 0:
			r.Outputs = r.Outputs[:len(r.Outputs)-1]
		case strings.HasPrefix(l, "Final flow:"):
			f := strings.TrimSpace(strings.TrimPrefix(l, "Final flow:"))
			if f != "unchanged" {
				r.Final = fields(f)
			}
		}
		if m := outputPort.FindStringSubmatch(l); m != nil {
			r.Outputs = append(r.Outputs, atou(m[1]))
		}
		if m := outputN.FindStringSubmatch(l); m != nil {
			r.Outputs = append(r.Outputs, atou(m[1]))
		}
		if m := controller.FindStringSubmatch(l); m != nil {
			c, _ := strconv.ParseUint(m[1], 16, 8)
			r.PacketIns = append(r.PacketIns, PacketIn{Category: uint8(c), Table: cur})
		}
	}
	if dropAt >= 0 && dropAt == len(r.Tables)-1 {
		r.Dropped, r.DropTable = true, r.Tables[dropAt]
	}
	return r, nil
}

func atou(s string) uint32 {
	v, _ := strconv.ParseUint(s, 10, 32)
	return uint32(v)
}

// fields splits a printed flow into its key=value fields (bare words,
// such as the protocol, map to "").
func fields(flow string) map[string]string {
	out := map[string]string{}
	for _, kv := range strings.Split(flow, ",") {
		k, v, _ := strings.Cut(kv, "=")
		out[k] = v
	}
	return out
}
