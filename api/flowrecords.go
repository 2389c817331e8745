package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"sluice/flow"
	"sluice/flow/flowjson"
)

// Flow-record API limits.
const (
	// DefaultFlowRecordsLimit is how many records GET /flowrecords returns
	// when the request names no limit: a store of a million flows would
	// otherwise answer with a gigabyte.
	DefaultFlowRecordsLimit = 10_000
	// MaxFlowRecordsLimit is the largest limit a request may ask for.
	MaxFlowRecordsLimit = 1_000_000
	// queryTimeout bounds how long a request waits for the store.
	queryTimeout = 10 * time.Second
)

// FlowSource answers flow-record queries (Aggregate mode's store).
type FlowSource interface {
	Query(ctx context.Context, q flow.Query) ([]*flow.Flow, int, error)
}

// RecordMetrics is the body of GET /recordmetrics, with the reference's
// keys.
type RecordMetrics struct {
	NumRecordsExported     int64 `json:"numRecordsExported"`
	NumRecordsReceived     int64 `json:"numRecordsReceived"`
	NumRecordsDropped      int64 `json:"numRecordsDropped"`
	NumFlows               int64 `json:"numFlows"`
	NumConnToCollector     int64 `json:"numConnToCollector"`
	WithClickHouseExporter bool  `json:"withClickHouseExporter,omitempty"`
	WithS3Exporter         bool  `json:"withS3Exporter,omitempty"`
	WithLogExporter        bool  `json:"withLogExporter,omitempty"`
	WithIPFIXExporter      bool  `json:"withIPFIXExporter,omitempty"`
}

// Headers of GET /flowrecords beyond the body.
const (
	// HeaderMatches is the number of flows the filters selected.
	HeaderMatches = "X-Sluice-Matches"
	// HeaderTruncated is "true" when the limit cut the answer short.
	HeaderTruncated = "X-Sluice-Truncated"
)

// HandleFlowRecords serves GET /flowrecords from src, rendering records
// with renderers from newRenderer (one per request). A nil src (Proxy
// mode keeps no flows) answers with an empty list.
func (s *Server) HandleFlowRecords(src FlowSource, newRenderer func() (*flowjson.Renderer, error)) {
	s.Mux.HandleFunc("GET /flowrecords", func(w http.ResponseWriter, r *http.Request) {
		q, err := ParseFlowQuery(r.URL.Query())
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var flows []*flow.Flow
		var n int
		if src != nil {
			ctx, cancel := context.WithTimeout(r.Context(), queryTimeout)
			flows, n, err = src.Query(ctx, q)
			cancel()
			if err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		rd, err := newRenderer()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		b := append(make([]byte, 0, 64+len(flows)*1024), '[')
		wrote := 0
		for _, f := range flows {
			mark := len(b)
			if wrote > 0 {
				b = append(b, ',')
			}
			if b, err = rd.AppendObject(b, f); err != nil {
				s.log.Warn("cannot render a flow record", "err", err)
				b = b[:mark]
				continue
			}
			wrote++
		}
		b = append(b, "]\n"...)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set(HeaderMatches, strconv.Itoa(n))
		w.Header().Set(HeaderTruncated, strconv.FormatBool(n > len(flows)))
		_, _ = w.Write(b)
	})
}

// HandleRecordMetrics serves GET /recordmetrics from get.
func (s *Server) HandleRecordMetrics(get func() RecordMetrics) {
	s.Mux.HandleFunc("GET /recordmetrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(get())
	})
}

// ParseFlowQuery reads the filters of GET /flowrecords: srcip, dstip,
// proto (a number or tcp, udp, icmp, icmpv6, sctp), srcport, dstport, and
// limit (default DefaultFlowRecordsLimit).
func ParseFlowQuery(v map[string][]string) (flow.Query, error) {
	q := flow.Query{Limit: DefaultFlowRecordsLimit}
	get := func(k string) string {
		if x := v[k]; len(x) > 0 {
			return strings.TrimSpace(x[0])
		}
		return ""
	}
	var err error
	addr := func(k string) netip.Addr {
		s := get(k)
		if s == "" || err != nil {
			return netip.Addr{}
		}
		a, e := netip.ParseAddr(s)
		if e != nil {
			err = fmt.Errorf("%s: %q is not an IP address", k, s)
		}
		return a.Unmap()
	}
	port := func(k string) uint16 {
		s := get(k)
		if s == "" || err != nil {
			return 0
		}
		p, e := strconv.ParseUint(s, 10, 16)
		if e != nil {
			err = fmt.Errorf("%s: %q is not a port number", k, s)
		}
		return uint16(p)
	}
	q.SrcIP, q.DstIP = addr("srcip"), addr("dstip")
	q.SrcPort, q.DstPort = port("srcport"), port("dstport")
	if s := get("proto"); s != "" && err == nil {
		q.Proto, err = ParseProtocol(s)
	}
	if s := get("limit"); s != "" && err == nil {
		l, e := strconv.Atoi(s)
		if e != nil || l < 1 || l > MaxFlowRecordsLimit {
			err = fmt.Errorf("limit: %q is not a number from 1 to %d", s, MaxFlowRecordsLimit)
		}
		q.Limit = l
	}
	return q, err
}

// ParseProtocol reads an IP protocol: a number from 0 to 255, or one of
// tcp, udp, icmp, icmpv6 (ipv6-icmp), sctp.
func ParseProtocol(s string) (uint8, error) {
	switch strings.ToLower(s) {
	case "tcp":
		return 6, nil
	case "udp":
		return 17, nil
	case "icmp":
		return 1, nil
	case "icmpv6", "ipv6-icmp":
		return 58, nil
	case "sctp":
		return 132, nil
	}
	p, err := strconv.ParseUint(s, 10, 8)
	if err != nil {
		return 0, fmt.Errorf("proto: %q is neither a protocol number nor tcp, udp, icmp, icmpv6 or sctp", s)
	}
	return uint8(p), nil
}
