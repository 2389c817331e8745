package tracer

import (
	"context"
	"errors"
	"strings"
	"testing"

	"sluice/traceflow/crd"
	"sluice/traceflow/pipeline"
)

// TestMulticastDestinations: IPv6 multicast is always refused (the
// reference's IPv6 table switches it before any Traceflow flow); IPv4
// multicast is refused only with the agents' multicast.enable, and is
// otherwise routed as any outside address.
func TestMulticastDestinations(t *testing.T) {
	run := func(multicast bool, dst, flow string) (*crd.Traceflow, error) {
		m := loadModel(t, pipeline.Encap)
		m.Config.Multicast = multicast
		s, d, err := Endpoints(m.State, "default/db", dst)
		if err != nil {
			t.Fatal(err)
		}
		tf := &crd.Traceflow{Spec: crd.TraceflowSpec{Source: s, Destination: d}}
		if strings.Contains(flow, "ipv6") {
			tf.Spec.Packet.IPv6Header = &crd.IPv6Header{}
		}
		tf.Name = "mc"
		tr, err := Run(context.Background(), m, tf, Options{Now: fixedNow})
		if err != nil {
			return nil, err
		}
		return tr.Traceflow, nil
	}
	for _, c := range []struct {
		multicast bool
		dst, flow string
		refused   string // "" when traced
	}{
		{false, "239.1.2.3", "", ""},
		{true, "239.1.2.3", "", "multicast.enable"},
		{true, "224.0.0.251", "", "multicast.enable"},
		{false, "ff05::1", "ipv6", "IPv6 multicast"},
		{true, "ff02::fb", "ipv6", "IPv6 multicast"},
		{true, "10.10.2.7", "", ""},
	} {
		tf, err := run(c.multicast, c.dst, c.flow)
		var ue *UntraceableError
		switch {
		case c.refused == "" && err != nil:
			t.Errorf("%s (multicast %v): %v, want a trace", c.dst, c.multicast, err)
		case c.refused == "" && tf.Status.Phase != crd.PhaseSucceeded:
			t.Errorf("%s (multicast %v): phase %s, want Succeeded", c.dst, c.multicast, tf.Status.Phase)
		case c.refused != "" && (!errors.As(err, &ue) || !strings.Contains(err.Error(), c.refused)):
			t.Errorf("%s (multicast %v): error %v, want an UntraceableError about %s", c.dst, c.multicast, err, c.refused)
		}
	}
}
