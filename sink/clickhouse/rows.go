package clickhouse

import (
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"sluice/flow"
)

// block holds rows column by column, each column a typed slice that is
// reused from one insert to the next, so that appending a batch to the
// driver is one call per column.
type block struct {
	times   [4][]time.Time // flowStartSeconds … flowEndSecondsFromDestinationNode
	u8      [7][]uint8     // flowEndReason, protocolIdentifier, ingress action and type, egress action and type, flowType
	u16     [3][]uint16    // sourceTransportPort, destinationTransportPort, destinationServicePort
	u64     [14][]uint64   // 8 counters, 6 throughputs
	strs    [24][]string
	addrs   *addrCache
	n       int
	insert  string   // the INSERT statement
	targets []target // where each inserted column's values are
	// clusterUUID is the clusterUUID column's value; empty: each
	// record's clusterId (see Options.ClusterUUID).
	clusterUUID string
}

// kinds of a column's slice in a block.
const (
	kTime = iota
	kU8
	kU16
	kU64
	kStr
)

// target is a column of the INSERT and its slice in the block.
type target struct{ kind, idx int }

// columnSlots places every column of Columns in the block, in order.
var columnSlots = func() map[string]target {
	m := map[string]target{}
	var next [5]int
	for _, c := range columns {
		k := kStr
		switch c.Type {
		case "DateTime":
			k = kTime
		case "UInt8":
			k = kU8
		case "UInt16":
			k = kU16
		case "UInt64":
			k = kU64
		}
		m[c.Name] = target{k, next[k]}
		next[k]++
	}
	return m
}()

// newBlock makes a block inserting the columns of have (all of Columns
// when nil) into db.
func newBlock(db string, have map[string]bool) *block {
	b := &block{addrs: newAddrCache(1 << 16)}
	var names []string
	for _, c := range columns {
		if have != nil && !have[c.Name] {
			continue
		}
		names = append(names, c.Name)
		b.targets = append(b.targets, columnSlots[c.Name])
	}
	b.insert = fmt.Sprintf("INSERT INTO %s.%s (%s)", quote(db), Table, strings.Join(names, ", "))
	return b
}

func seconds(t time.Time) time.Time {
	if t.IsZero() {
		return time.Unix(0, 0)
	}
	return t
}

// cluster is f's clusterUUID column.
func (b *block) cluster(f *flow.Flow) string {
	if b.clusterUUID != "" {
		return b.clusterUUID
	}
	return f.ClusterID
}

// add appends f as a row.
func (b *block) add(f *flow.Flow) {
	var ag flow.Aggregation
	if f.Aggregation != nil {
		ag = *f.Aggregation
	}
	b.times[0] = append(b.times[0], seconds(f.StartTime))
	b.times[1] = append(b.times[1], seconds(f.EndTime))
	b.times[2] = append(b.times[2], seconds(ag.EndFromSource))
	b.times[3] = append(b.times[3], seconds(ag.EndFromDestination))

	b.u8[0] = append(b.u8[0], f.EndReason)
	b.u8[1] = append(b.u8[1], f.Protocol)
	b.u8[2] = append(b.u8[2], f.Ingress.RuleAction)
	b.u8[3] = append(b.u8[3], f.Ingress.Type)
	b.u8[4] = append(b.u8[4], f.Egress.RuleAction)
	b.u8[5] = append(b.u8[5], f.Egress.Type)
	b.u8[6] = append(b.u8[6], f.FlowType)

	b.u16[0] = append(b.u16[0], f.SourcePort)
	b.u16[1] = append(b.u16[1], f.DestinationPort)
	b.u16[2] = append(b.u16[2], f.DestinationServicePort)

	for i, v := range [...]uint64{f.Stats.PacketTotalCount, f.Stats.OctetTotalCount, f.Stats.PacketDeltaCount,
		f.Stats.OctetDeltaCount, f.ReverseStats.PacketTotalCount, f.ReverseStats.OctetTotalCount,
		f.ReverseStats.PacketDeltaCount, f.ReverseStats.OctetDeltaCount,
		ag.Throughput, ag.ReverseThroughput, ag.ThroughputFromSource, ag.ThroughputFromDestination,
		ag.ReverseThroughputFromSource, ag.ReverseThroughputFromDestination} {
		b.u64[i] = append(b.u64[i], v)
	}

	a := b.addrs
	for i, v := range [...]string{
		a.str(f.SourceIP), a.str(f.DestinationIP),
		f.SourcePodName, f.SourcePodNamespace, f.SourceNodeName,
		f.DestinationPodName, f.DestinationPodNamespace, f.DestinationNodeName,
		a.str(f.DestinationClusterIP), a.str(f.DestinationServiceIP), f.DestinationServicePortName,
		f.Ingress.Name, f.Ingress.Namespace, f.Ingress.RuleName,
		f.Egress.Name, f.Egress.Namespace, f.Egress.RuleName,
		f.TCPState, f.SourcePodLabels, f.DestinationPodLabels,
		b.cluster(f), f.EgressName, a.str(f.EgressIP), f.EgressNodeName,
	} {
		b.strs[i] = append(b.strs[i], v)
	}
	b.n++
}

// reset empties the block, keeping its slices' room.
func (b *block) reset() {
	for i := range b.times {
		clear(b.times[i])
		b.times[i] = b.times[i][:0]
	}
	for i := range b.u8 {
		b.u8[i] = b.u8[i][:0]
	}
	for i := range b.u16 {
		b.u16[i] = b.u16[i][:0]
	}
	for i := range b.u64 {
		b.u64[i] = b.u64[i][:0]
	}
	for i := range b.strs {
		clear(b.strs[i]) // let the strings go
		b.strs[i] = b.strs[i][:0]
	}
	b.n = 0
}

// appendTo hands every column to the batch, one call a column.
func (b *block) appendTo(batch driver.Batch) error {
	for i, t := range b.targets {
		var v any
		switch t.kind {
		case kTime:
			v = b.times[t.idx]
		case kU8:
			v = b.u8[t.idx]
		case kU16:
			v = b.u16[t.idx]
		case kU64:
			v = b.u64[t.idx]
		default:
			v = b.strs[t.idx]
		}
		if err := batch.Column(i).Append(v); err != nil {
			return fmt.Errorf("column %d: %w", i, err)
		}
	}
	return nil
}

// addrCache renders addresses as text once: the same Pod and Service
// addresses recur in row after row. It forgets everything when full.
type addrCache struct {
	m   map[netip.Addr]string
	max int
}

func newAddrCache(max int) *addrCache {
	return &addrCache{m: make(map[netip.Addr]string), max: max}
}

// str is the address as the table holds it: IPv4-mapped addresses as
// IPv4 (as the IPFIX export sends them), "" for an unset one.
func (c *addrCache) str(a netip.Addr) string {
	if !a.IsValid() {
		return ""
	}
	if s, ok := c.m[a]; ok {
		return s
	}
	s := a.Unmap().String()
	if len(c.m) >= c.max {
		clear(c.m)
	}
	c.m[a] = s
	return s
}
