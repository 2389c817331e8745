package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"sluice/flow"
	"sluice/flow/flowproto"
	"sluice/flow/ipfixmap"
	"sluice/ipfix"
)

// agents is how many Nodes' agents send at once. Connection i goes from a
// Pod on Node i%agents to a Pod on Node (i+1)%agents, so every connection
// is inter-Node and reaches the aggregator as two records, one from each
// side, as Antrea agents send them.
const agents = 4

// batch is how many records an agent builds at a time.
const batch = 512

// connFlow fills f with agent a's record of connection i (the source or
// the destination side). Connection i's addresses encode i, so that the
// receiver can tell which connections arrived.
func connFlow(f *flow.Flow, i int, srcSide bool, end time.Time) {
	*f = flow.Flow{}
	f.StartTime, f.EndTime, f.EndReason = end.Add(-10*time.Second), end, 2
	f.SourceIP = netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
	f.DestinationIP = netip.AddrFrom4([4]byte{11, byte(i >> 16), byte(i >> 8), byte(i)})
	f.SourcePort, f.DestinationPort, f.Protocol, f.TCPState = uint16(1024+i%60000), 8080, 6, "ESTABLISHED"
	f.FlowType = flow.FlowTypeInterNode
	f.Stats = flow.Stats{PacketTotalCount: 100, PacketDeltaCount: 100, OctetTotalCount: 10000, OctetDeltaCount: 10000}
	f.ReverseStats = flow.Stats{PacketTotalCount: 50, PacketDeltaCount: 50, OctetTotalCount: 5000, OctetDeltaCount: 5000}
	src, dst := i%agents, (i+1)%agents
	present := []flow.Field{flow.StartTime, flow.EndTime, flow.EndReason, flow.SourceIP, flow.DestinationIP,
		flow.Protocol, flow.SourcePort, flow.DestinationPort, flow.TCPState, flow.FlowType,
		flow.PacketTotalCount, flow.PacketDeltaCount, flow.OctetTotalCount, flow.OctetDeltaCount,
		flow.ReversePacketTotalCount, flow.ReversePacketDeltaCount, flow.ReverseOctetTotalCount, flow.ReverseOctetDeltaCount}
	if srcSide {
		f.SourcePodName, f.SourcePodNamespace, f.SourceNodeName = fmt.Sprintf("client-%d", i%500), "team-a", fmt.Sprintf("node-%d", src)
		present = append(present, flow.SourcePodName, flow.SourcePodNamespace, flow.SourceNodeName)
	} else {
		f.DestinationPodName, f.DestinationPodNamespace, f.DestinationNodeName = fmt.Sprintf("server-%d", i%200), "team-b", fmt.Sprintf("node-%d", dst)
		present = append(present, flow.DestinationPodName, flow.DestinationPodNamespace, flow.DestinationNodeName)
	}
	for _, p := range present {
		f.Present.Set(p)
	}
}

// agentRecords calls emit with agent a's records of connections [0, n),
// batch by batch (the slice is reused).
func agentRecords(a, n int, emit func([]flow.Flow) error) error {
	end := time.Now().Truncate(time.Second)
	buf := make([]flow.Flow, 0, batch)
	for i := range n {
		src, dst := i%agents, (i+1)%agents
		if a == src {
			buf = append(buf, flow.Flow{})
			connFlow(&buf[len(buf)-1], i, true, end)
		}
		if a == dst {
			buf = append(buf, flow.Flow{})
			connFlow(&buf[len(buf)-1], i, false, end)
		}
		if len(buf) >= batch {
			if err := emit(buf); err != nil {
				return err
			}
			buf = buf[:0]
		}
	}
	if len(buf) > 0 {
		return emit(buf)
	}
	return nil
}

// sendIPFIX plays agent a over IPFIX/TCP (the Antrea v2.7 agent's element
// set and template), sending its records of n connections. The connection
// stays open, as an agent's does, until the returned function closes it:
// the reference's collector forgets a closed connection's templates, and
// with them records of it still queued.
func sendIPFIX(ctx context.Context, addr string, a, n int) (func(), error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	// A cancelled run must not wait for an aggregator that stopped reading.
	stop := context.AfterFunc(ctx, func() { c.Close() })
	if err := writeIPFIX(c, a, n); err != nil {
		stop()
		c.Close()
		return nil, err
	}
	return func() { stop(); c.Close() }, nil
}

func writeIPFIX(c net.Conn, a, n int) error {
	table, err := ipfixmap.NewTable(ipfix.DefaultRegistry())
	if err != nil {
		return err
	}
	names, err := ipfixmap.AgentElements("v2.7", 4)
	if err != nil {
		return err
	}
	els, err := table.Elements(names)
	if err != nil {
		return err
	}
	tmpl, err := ipfixmap.TemplateOf(256, els)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(c, 64<<10)
	enc, err := ipfix.NewEncoder(ipfix.EncoderOptions{}, func(m []byte) error { _, err := w.Write(m); return err })
	if err != nil {
		return err
	}
	domain := uint32(a + 1)
	// The template in a message of its own, as Antrea agents (go-ipfix)
	// send it: the reference's collector reads only the first set of a
	// message, so data behind a template set would be lost to it.
	if err := enc.AddTemplate(domain, tmpl); err != nil {
		return err
	}
	if err := enc.Flush(); err != nil {
		return err
	}
	err = agentRecords(a, n, func(fs []flow.Flow) error {
		for i := range fs {
			if err := ipfixmap.WriteRecord(enc.Begin(domain, tmpl), els, &fs[i]); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := enc.Flush(); err != nil {
		return err
	}
	return w.Flush()
}

// rawCodec sends pre-marshalled ExportRequests as they are.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return v.([]byte), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	*(v.(*[]byte)) = append((*(v.(*[]byte)))[:0], data...)
	return nil
}
func (rawCodec) Name() string { return "proto" }

// sendGRPC plays agent a over Antrea's FlowExportService (mutual TLS, one
// Flow per ExportRequest, as Antrea agents send), then waits for the
// server's answer, which comes once it has read the whole stream.
func sendGRPC(ctx context.Context, addr string, tc *tls.Config, a, n int) error {
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		return err
	}
	defer cc.Close()
	st, err := cc.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true},
		"/antrea_io.antrea.pkg.apis.flow.v1alpha1.FlowExportService/Export", grpc.ForceCodec(rawCodec{}))
	if err != nil {
		return err
	}
	var bad error
	seq := uint32(0)
	err = agentRecords(a, n, func(fs []flow.Flow) error {
		now := time.Now()
		for i := range fs {
			// What the agent says about itself; the reference
			// dereferences it for every record.
			seq++
			fs[i].Origin = flow.Origin{ExportTime: now, SequenceNumber: seq, ObservationDomainID: uint32(a + 1)}
			req := flowproto.AppendExportRequest(nil, fs[i:i+1], func(_ *flow.Flow, err error) { bad = err })
			if bad != nil {
				return bad
			}
			if err := st.SendMsg(req); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := st.CloseSend(); err != nil {
		return err
	}
	var resp []byte
	return st.RecvMsg(&resp)
}

// receiver is the counting IPFIX collector the aggregators export to: it
// decodes every record and marks which connections (and, in Proxy mode,
// which sides) arrived, so that duplicates are not counted as delivered.
type receiver struct {
	ln       net.Listener
	mu       sync.Mutex
	seen     []uint64 // bit 2*i: connection i source side or correlated; 2*i+1: destination side
	distinct int
	records  int
	last     time.Time
	mark     int       // distinct records at which markAt is taken
	markAt   time.Time // when the receiver first held mark distinct records
	errs     []error
	wg       sync.WaitGroup
	closed   atomic.Bool
}

func newReceiver(n, mark int) (*receiver, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &receiver{ln: ln, seen: make([]uint64, (2*n+63)/64), mark: mark}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			r.wg.Add(1)
			go func() { defer r.wg.Done(); r.serve(c) }()
		}
	}()
	return r, nil
}

func (r *receiver) addr() string { return r.ln.Addr().String() }

func (r *receiver) serve(c net.Conn) {
	defer c.Close()
	go func() {
		// Unblocks the read when the receiver closes.
		for !r.closed.Load() {
			time.Sleep(100 * time.Millisecond)
		}
		c.Close()
	}()
	sess := ipfix.NewSession(ipfix.SessionOptions{})
	d := ipfix.NewDecoder(sess)
	mr := ipfix.NewMessageReader(c)
	// Where each template keeps sourceIPv4Address (IANA 8) and Antrea's
	// sourcePodName (56506/101): reading two fields, not normalising whole
	// records, keeps the receiver from being what slows the export down.
	type pos struct{ src, pod int }
	plans := map[*ipfix.Template]pos{}
	for {
		m, err := mr.Next()
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && !r.closed.Load() {
				r.fail(err)
			}
			return
		}
		if err := d.Reset(m, time.Now()); err != nil {
			r.fail(err)
			return
		}
		r.mu.Lock()
		for d.Next() {
			rec := d.Record()
			p, ok := plans[rec.Template]
			if !ok {
				p = pos{-1, -1}
				for i := range rec.Template.Fields {
					f := &rec.Template.Fields[i]
					switch {
					case f.EnterpriseID == 0 && f.ID == 8:
						p.src = i
					case f.EnterpriseID == 56506 && f.ID == 101:
						p.pod = i
					}
				}
				plans[rec.Template] = p
			}
			r.records++
			if p.src < 0 {
				continue
			}
			b := rec.Bytes(p.src)
			if len(b) != 4 {
				continue
			}
			i := int(b[1])<<16 | int(b[2])<<8 | int(b[3])
			bit := 2 * i
			if p.pod < 0 || rec.Len(p.pod) == 0 {
				bit++ // Proxy mode: a destination Node's record
			}
			if bit/64 >= len(r.seen) {
				continue
			}
			if r.seen[bit/64]&(1<<(bit%64)) == 0 {
				r.seen[bit/64] |= 1 << (bit % 64)
				r.distinct++
				r.last = time.Now()
				if r.distinct == r.mark {
					r.markAt = r.last
				}
			}
		}
		r.mu.Unlock()
		if err := d.Err(); err != nil {
			r.fail(err)
			return
		}
	}
}

func (r *receiver) fail(err error) {
	r.mu.Lock()
	r.errs = append(r.errs, err)
	r.mu.Unlock()
}

// counts returns the distinct records (connections or sides), all records,
// when the last new one arrived, and when the mark was reached (zero if
// not).
func (r *receiver) counts() (distinct, records int, last, mark time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.distinct, r.records, r.last, r.markAt
}

func (r *receiver) close() []error {
	r.closed.Store(true)
	r.ln.Close()
	r.wg.Wait()
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.errs
}
