package flowsrc

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"sluice/api"
	"sluice/flow"
)

// API is a running aggregator's HTTP API (Aggregate mode's GET
// /flowrecords). It holds the flows the aggregator still stores, up to
// api.MaxFlowRecordsLimit of them.
type API struct {
	Server string
	// Truncated is set by Read when the aggregator held more flows than
	// one answer may carry.
	Truncated bool
}

func (a *API) String() string { return a.Server }

// apiTimeout bounds the whole read of the API's answer.
const apiTimeout = 10 * time.Minute

// Read implements Source. The answer (up to a million records) is decoded
// one record at a time as it arrives: held whole, as element maps, it
// would take gigabytes.
func (a *API) Read(ctx context.Context, since time.Time, fn func(*Record) error) error {
	base := a.Server
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	u, err := url.Parse(base)
	if err != nil {
		return fmt.Errorf("aggregator API %q: %w", a.Server, err)
	}
	u.Path = strings.TrimSuffix(u.Path, "/") + "/flowrecords"
	u.RawQuery = url.Values{"limit": {strconv.Itoa(api.MaxFlowRecordsLimit)}}.Encode()
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return fmt.Errorf("aggregator API %s: %w", a.Server, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("aggregator API %s: %w", a.Server, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		return fmt.Errorf("aggregator API %s: GET %s: %s: %s", a.Server, u.Path, resp.Status, bytes.TrimSpace(b))
	}
	d := json.NewDecoder(resp.Body)
	d.UseNumber() // keep 64-bit counters exact
	if t, err := d.Token(); err != nil || t != json.Delim('[') {
		return fmt.Errorf("aggregator API %s: the answer is not a list of records (%v)", a.Server, err)
	}
	var rec Record
	n := 0
	for ; d.More(); n++ {
		var m map[string]any
		if err := d.Decode(&m); err != nil {
			return fmt.Errorf("aggregator API %s: record %d: %w", a.Server, n, err)
		}
		if err := FromElements(m, &rec); err != nil {
			return fmt.Errorf("aggregator API %s: record %d: %w", a.Server, n, err)
		}
		if !since.IsZero() && rec.End.Before(since) {
			continue
		}
		if err := fn(&rec); err != nil {
			return err
		}
	}
	if _, err := d.Token(); err != nil {
		return fmt.Errorf("aggregator API %s: after record %d: %w", a.Server, n, err)
	}
	if m, err := strconv.Atoi(resp.Header.Get(api.HeaderMatches)); err == nil {
		a.Truncated = m > n
	}
	return nil
}

// FromElements reads a record given as IPFIX element name → value (the
// API's JSON; numbers as json.Number or float64, times as RFC 3339).
func FromElements(m map[string]any, r *Record) error {
	*r = Record{}
	str := func(k string) string { s, _ := m[k].(string); return s }
	num := func(k string, max uint64) (uint64, error) {
		v, ok := m[k]
		if !ok {
			return 0, nil
		}
		var n uint64
		switch t := v.(type) {
		case json.Number:
			x, err := strconv.ParseUint(t.String(), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s: %q is not a count", k, t)
			}
			n = x
		case float64:
			if t < 0 || t != float64(uint64(t)) {
				return 0, fmt.Errorf("%s: %v is not a count", k, t)
			}
			n = uint64(t)
		default:
			return 0, fmt.Errorf("%s: %v is not a number", k, v)
		}
		if n > max {
			return 0, fmt.Errorf("%s: %d is out of range", k, n)
		}
		return n, nil
	}
	tm := func(k string) (time.Time, error) {
		s := str(k)
		if s == "" {
			return time.Time{}, nil
		}
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return time.Time{}, fmt.Errorf("%s: %w", k, err)
		}
		return t.UTC(), nil
	}
	ip := func(keys ...string) (netip.Addr, error) {
		for _, k := range keys {
			if s := str(k); s != "" {
				a, err := netip.ParseAddr(s)
				if err != nil {
					return a, fmt.Errorf("%s: %w", k, err)
				}
				return a.Unmap(), nil
			}
		}
		return netip.Addr{}, nil
	}
	var err error
	if r.Start, err = tm("flowStartSeconds"); err != nil {
		return err
	}
	if r.End, err = tm("flowEndSeconds"); err != nil {
		return err
	}
	if r.Src, err = ip("sourceIPv4Address", "sourceIPv6Address"); err != nil {
		return err
	}
	if r.Dst, err = ip("destinationIPv4Address", "destinationIPv6Address"); err != nil {
		return err
	}
	if !r.Src.IsValid() || !r.Dst.IsValid() {
		return fmt.Errorf("no source or destination address")
	}
	if r.ClusterIP, err = ip("destinationClusterIPv4", "destinationClusterIPv6"); err != nil {
		return err
	}
	var n uint64
	if n, err = num("sourceTransportPort", 65535); err != nil {
		return err
	}
	r.SrcPort = uint16(n)
	if n, err = num("destinationTransportPort", 65535); err != nil {
		return err
	}
	r.DstPort = uint16(n)
	if n, err = num("protocolIdentifier", 255); err != nil {
		return err
	}
	r.Proto = uint8(n)
	r.SrcNamespace, r.SrcPod = str("sourcePodNamespace"), str("sourcePodName")
	r.DstNamespace, r.DstPod = str("destinationPodNamespace"), str("destinationPodName")
	r.ServicePortName = str("destinationServicePortName")
	for _, p := range []struct {
		prefix string
		dst    *flow.Policy
	}{{"ingress", &r.Ingress}, {"egress", &r.Egress}} {
		p.dst.Name = str(p.prefix + "NetworkPolicyName")
		p.dst.Namespace = str(p.prefix + "NetworkPolicyNamespace")
		p.dst.RuleName = str(p.prefix + "NetworkPolicyRuleName")
		if n, err = num(p.prefix+"NetworkPolicyRuleAction", 255); err != nil {
			return err
		}
		p.dst.RuleAction = uint8(n)
		if n, err = num(p.prefix+"NetworkPolicyType", 255); err != nil {
			return err
		}
		p.dst.Type = uint8(n)
	}
	return nil
}
