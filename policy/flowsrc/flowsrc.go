// Package flowsrc reads observed flow records for `sluice policy`: from a
// flow log file (the flowLogger sink's comma-separated lines, plain or
// gzipped), or from a running aggregator's HTTP API (GET /flowrecords).
// Records are streamed to a callback, so that a large log is never held in
// memory.
package flowsrc

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"sluice/flow"
)

// Record is what `sluice policy` needs of one flow record.
type Record struct {
	Start, End       time.Time
	Src, Dst         netip.Addr
	SrcPort, DstPort uint16
	Proto            uint8
	SrcNamespace     string
	SrcPod           string
	DstNamespace     string
	DstPod           string
	// ClusterIP is the Service address the client dialled (invalid when
	// none); Dst is then the endpoint after DNAT.
	ClusterIP       netip.Addr
	ServicePortName string
	Ingress, Egress flow.Policy
}

// Denied says a policy rule dropped or rejected the record's connection.
func (r *Record) Denied() bool {
	return isDeny(r.Ingress.RuleAction) || isDeny(r.Egress.RuleAction)
}

func isDeny(a uint8) bool { return a == flow.ActionDrop || a == flow.ActionReject }

// Source yields records.
type Source interface {
	// Read calls fn for every record that ended at or after since (every
	// record when since is zero), in the source's order. An error of fn
	// stops the read and is returned.
	Read(ctx context.Context, since time.Time, fn func(*Record) error) error
	// String names the source in messages.
	String() string
}

// Open returns the source a --flows argument names: an http:// or
// https:// URL is an aggregator's API; a tcp:// or tls://
// URL is a ClickHouse server's flows table (tcp://HOST:9000/DB);
// anything else is a flow log file.
func Open(spec string) (Source, error) {
	switch {
	case spec == "":
		return nil, errors.New("no flow source: give --flows FILE|URL")
	case strings.HasPrefix(spec, "http://"), strings.HasPrefix(spec, "https://"):
		return &API{Server: spec}, nil
	case strings.HasPrefix(spec, "tcp://"), strings.HasPrefix(spec, "tls://"):
		return &ClickHouse{URL: spec}, nil
	}
	if _, err := os.Stat(spec); err != nil && looksLikeHostPort(spec) {
		return &API{Server: "http://" + spec}, nil
	}
	return &File{Path: spec}, nil
}

// looksLikeHostPort says s is host:port with a numeric port, an
// aggregator's API address given without a scheme.
func looksLikeHostPort(s string) bool {
	_, port, err := net.SplitHostPort(s)
	if err != nil {
		return false
	}
	_, err = strconv.ParseUint(port, 10, 16)
	return err == nil
}

// FromFlow reads what a Record needs of a flow record held in memory (the
// web UI's history).
func FromFlow(f *flow.Flow, r *Record) {
	*r = Record{Start: f.StartTime, End: f.EndTime, Src: f.SourceIP.Unmap(), Dst: f.DestinationIP.Unmap(),
		SrcPort: f.SourcePort, DstPort: f.DestinationPort, Proto: f.Protocol,
		SrcNamespace: f.SourcePodNamespace, SrcPod: f.SourcePodName,
		DstNamespace: f.DestinationPodNamespace, DstPod: f.DestinationPodName,
		ClusterIP: f.DestinationClusterIP.Unmap(), ServicePortName: f.DestinationServicePortName,
		Ingress: f.Ingress, Egress: f.Egress}
}
