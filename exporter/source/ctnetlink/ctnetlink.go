// Package ctnetlink reads Linux conntrack entries through netlink,
// optionally in another network namespace, as an exporter source.
package ctnetlink

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/mdlayher/netlink"
	"github.com/ti-mo/conntrack"

	"sluice/exporter/source"
)

// NetnsDir is where `ip netns add` binds named network namespaces.
const NetnsDir = "/var/run/netns"

// Source dumps the conntrack table of one network namespace.
type Source struct {
	mu   sync.Mutex
	conn *conntrack.Conn
	ns   *os.File
}

var _ source.Source = (*Source)(nil)

// Open connects to conntrack in the named network namespace (as `ip netns`
// names them), or in the caller's own when netns is empty. netns may also
// be a path to a namespace file (/proc/PID/ns/net).
func Open(netns string) (*Source, error) {
	s := &Source{}
	cfg := &netlink.Config{}
	if netns != "" {
		path := netns
		if !strings.ContainsRune(netns, '/') {
			path = filepath.Join(NetnsDir, netns)
		}
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("ctnetlink: network namespace %q: %w", netns, err)
		}
		s.ns = f
		cfg.NetNS = int(f.Fd())
	}
	c, err := conntrack.Dial(cfg)
	if err != nil {
		s.closeNS()
		return nil, fmt.Errorf("ctnetlink: connect to conntrack (netns %q): %w", netns, err)
	}
	// Dumps of large tables arrive in many messages at once.
	_ = c.SetReadBuffer(8 << 20)
	s.conn = c
	return s, nil
}

func (s *Source) closeNS() {
	if s.ns != nil {
		s.ns.Close()
		s.ns = nil
	}
}

// Dump implements source.Source.
func (s *Source) Dump(ctx context.Context, dst []source.Conn) ([]source.Conn, error) {
	if err := ctx.Err(); err != nil {
		return dst, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn == nil {
		return dst, fmt.Errorf("ctnetlink: source closed")
	}
	flows, err := s.conn.Dump(nil)
	if err != nil {
		return dst, fmt.Errorf("ctnetlink: dump: %w", err)
	}
	for i := range flows {
		if c, ok := convert(&flows[i]); ok {
			dst = append(dst, c)
		}
	}
	return dst, nil
}

// convert keeps the transport protocols with ports; ICMP and others have
// no 5-tuple the aggregator can correlate.
func convert(f *conntrack.Flow) (source.Conn, bool) {
	o, r := f.TupleOrig, f.TupleReply
	switch o.Proto.Protocol {
	case source.ProtoTCP, source.ProtoUDP, source.ProtoSCTP:
	default:
		return source.Conn{}, false
	}
	if !o.IP.SourceAddress.IsValid() || !r.IP.SourceAddress.IsValid() {
		return source.Conn{}, false
	}
	c := source.Conn{
		ID:             f.ID,
		Proto:          o.Proto.Protocol,
		OrigSrc:        netip.AddrPortFrom(o.IP.SourceAddress.Unmap(), o.Proto.SourcePort),
		OrigDst:        netip.AddrPortFrom(o.IP.DestinationAddress.Unmap(), o.Proto.DestinationPort),
		ReplySrc:       netip.AddrPortFrom(r.IP.SourceAddress.Unmap(), r.Proto.SourcePort),
		ReplyDst:       netip.AddrPortFrom(r.IP.DestinationAddress.Unmap(), r.Proto.DestinationPort),
		Packets:        f.CountersOrig.Packets,
		Bytes:          f.CountersOrig.Bytes,
		ReversePackets: f.CountersReply.Packets,
		ReverseBytes:   f.CountersReply.Bytes,
		Dying:          f.Status.Dying(),
		Start:          f.Timestamp.Start,
	}
	if f.ProtoInfo.TCP != nil {
		c.TCPState = f.ProtoInfo.TCP.State
	}
	return c, true
}

// Close implements source.Source.
func (s *Source) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var err error
	if s.conn != nil {
		err = s.conn.Close()
		s.conn = nil
	}
	s.closeNS()
	return err
}
