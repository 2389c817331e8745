package enrich

import (
	"net/netip"
	"testing"
	"time"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

func podName(p *Pod, ok bool) string {
	if !ok {
		return "<none>"
	}
	return p.Namespace + "/" + p.Name
}

func TestPodByIPTimeRule(t *testing.T) {
	ip := netip.MustParseAddr("10.244.1.5")
	only := netip.MustParseAddr("10.244.1.6")
	shared := netip.MustParseAddr("10.244.1.7")
	lag := netip.MustParseAddr("10.244.1.8")
	s := NewStatic([]Pod{
		// ip: old held it from 0 to 20m, new from 30m on.
		{Namespace: "ns", Name: "old", UID: "u-old", IPs: []netip.Addr{ip}, Created: at(0), Deleted: at(20 * time.Minute)},
		{Namespace: "ns", Name: "new", UID: "u-new", IPs: []netip.Addr{ip}, Created: at(30 * time.Minute)},
		// only: a deleted Pod and no live one.
		{Namespace: "ns", Name: "gone", UID: "u-gone", IPs: []netip.Addr{only}, Created: at(0), Deleted: at(10 * time.Minute)},
		// shared: two live Pods (a completed Pod still lists the IP).
		{Namespace: "ns", Name: "completed", UID: "u-c", IPs: []netip.Addr{shared}, Created: at(0)},
		{Namespace: "ns", Name: "running", UID: "u-r", IPs: []netip.Addr{shared}, Created: at(10 * time.Minute)},
		// lag: the deletion was noticed after the new Pod was created.
		{Namespace: "ns", Name: "before", UID: "u-b", IPs: []netip.Addr{lag}, Created: at(0), Deleted: at(12 * time.Minute)},
		{Namespace: "ns", Name: "after", UID: "u-a", IPs: []netip.Addr{lag}, Created: at(10 * time.Minute)},
	}, nil, nil)

	for _, tc := range []struct {
		ip   netip.Addr
		at   time.Time
		want string
	}{
		{ip, at(5 * time.Minute), "ns/old"},
		{ip, at(0), "ns/old"},                  // lifetime includes its start
		{ip, at(20 * time.Minute), "ns/new"},   // [Created, Deleted): not old any more; live fallback
		{ip, at(25 * time.Minute), "ns/new"},   // nobody held it: live fallback
		{ip, at(30 * time.Minute), "ns/new"},   //
		{ip, at(time.Hour), "ns/new"},          //
		{ip, at(-time.Hour), "ns/new"},         // before anything: live fallback
		{ip, time.Time{}, "ns/new"},            // unknown time: live
		{only, at(5 * time.Minute), "ns/gone"}, // flow started while it was alive
		{only, at(11 * time.Minute), "<none>"}, // started after it was gone
		{only, time.Time{}, "ns/gone"},         // unknown time: most recently deleted
		{shared, at(5 * time.Minute), "ns/completed"},
		{shared, at(15 * time.Minute), "ns/running"}, // most recently created wins
		{shared, time.Time{}, "ns/running"},
		{lag, at(5 * time.Minute), "ns/before"},
		{lag, at(11 * time.Minute), "ns/after"},
		{lag, at(13 * time.Minute), "ns/after"},
		{netip.MustParseAddr("10.244.1.99"), at(0), "<none>"},
		{netip.Addr{}, at(0), "<none>"},
		{netip.MustParseAddr("::ffff:10.244.1.5"), at(5 * time.Minute), "ns/old"}, // IPv4-mapped
	} {
		if got := podName(s.PodByIP(tc.ip, tc.at)); got != tc.want {
			t.Errorf("PodByIP(%v, %v) = %s, want %s", tc.ip, tc.at, got, tc.want)
		}
	}
}

func TestStaticNodesAndServices(t *testing.T) {
	s := NewStatic(nil,
		[]Node{{Name: "n1", UID: "un1", InternalIP: netip.MustParseAddr("::ffff:172.18.0.2")}},
		[]Service{{Namespace: "default", Name: "kubernetes", UID: "us1", ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.1")}}})
	if n, ok := s.NodeByName("n1"); !ok || n.UID != "un1" || n.InternalIP != netip.MustParseAddr("172.18.0.2") {
		t.Errorf("NodeByName(n1) = %+v, %v", n, ok)
	}
	if _, ok := s.NodeByName("n2"); ok {
		t.Error("NodeByName(n2) found")
	}
	if svc, ok := s.ServiceByName("default", "kubernetes"); !ok || svc.UID != "us1" {
		t.Errorf("ServiceByName = %+v, %v", svc, ok)
	}
	if _, ok := s.ServiceByName("kube-system", "kubernetes"); ok {
		t.Error("ServiceByName in the wrong namespace found")
	}
}

func TestStaticCopies(t *testing.T) {
	labels := map[string]string{"app": "a"}
	ips := []netip.Addr{netip.MustParseAddr("10.0.0.1")}
	s := NewStatic([]Pod{{Name: "p", Labels: labels, IPs: ips}}, nil, nil)
	labels["app"] = "changed"
	ips[0] = netip.MustParseAddr("10.0.0.2")
	p, ok := s.PodByIP(netip.MustParseAddr("10.0.0.1"), time.Time{})
	if !ok || p.Labels["app"] != "a" || p.LabelsJSON() != `{"app":"a"}` {
		t.Errorf("store shares the caller's data: %+v", p)
	}
}

func TestLabelsJSON(t *testing.T) {
	var nilPod *Pod
	for _, tc := range []struct {
		name string
		pod  *Pod
		want string
	}{
		{"nil pod", nilPod, ""},
		{"nil labels", &Pod{}, "{}"},
		{"empty labels", &Pod{Labels: map[string]string{}}, "{}"},
		{"sorted", &Pod{Labels: map[string]string{"tier": "web", "app": "frontend", "app.kubernetes.io/name": "x", "pod-template-hash": "6d4cf56db6"}},
			`{"app":"frontend","app.kubernetes.io/name":"x","pod-template-hash":"6d4cf56db6","tier":"web"}`},
		{"empty value", &Pod{Labels: map[string]string{"node-role.kubernetes.io/control-plane": ""}},
			`{"node-role.kubernetes.io/control-plane":""}`},
		{"quoting", &Pod{Labels: map[string]string{"k": `a"b\c`}}, `{"k":"a\"b\\c"}`},
	} {
		if got := tc.pod.LabelsJSON(); got != tc.want {
			t.Errorf("%s: LabelsJSON() = %q, want %q", tc.name, got, tc.want)
		}
		if tc.pod == nil {
			continue
		}
		// A Pod owned by a store gives the same, from its cache.
		p := *tc.pod
		p.IPs = []netip.Addr{netip.MustParseAddr("10.0.0.1")}
		got, _ := NewStatic([]Pod{p}, nil, nil).PodByIP(p.IPs[0], time.Time{})
		if got.labelsJSON != tc.want || got.LabelsJSON() != tc.want {
			t.Errorf("%s: cached LabelsJSON() = %q, want %q", tc.name, got.labelsJSON, tc.want)
		}
	}
}

func TestStoreLookupsDoNotAllocate(t *testing.T) {
	s := NewStatic([]Pod{
		{Namespace: "a", Name: "p1", Labels: map[string]string{"app": "x"}, IPs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}, Created: at(0), Deleted: at(time.Minute)},
		{Namespace: "a", Name: "p2", IPs: []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::1")}, Created: at(2 * time.Minute)},
	}, []Node{{Name: "n"}}, []Service{{Namespace: "a", Name: "s"}})
	v4, v6 := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::1")
	flowStart := at(30 * time.Second)
	allocs := testing.AllocsPerRun(1000, func() {
		p, _ := s.PodByIP(v4, flowStart)
		_ = p.LabelsJSON()
		p, _ = s.PodByIP(v6, time.Time{})
		_ = p.LabelsJSON()
		s.NodeByName("n")
		s.ServiceByName("a", "s")
	})
	if allocs != 0 {
		t.Errorf("lookups allocate %v times", allocs)
	}
}

func TestUnixNanoClamps(t *testing.T) {
	if got := unixNano(time.Time{}); got != minInt64 {
		t.Errorf("zero time = %d", got)
	}
	if got := unixNano(time.Date(1, 1, 2, 0, 0, 0, 0, time.UTC)); got != minInt64 {
		t.Errorf("year 1 = %d", got)
	}
	if got := unixNano(time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)); got != maxInt64 {
		t.Errorf("year 9999 = %d", got)
	}
	if got := unixNano(t0); got != t0.UnixNano() {
		t.Errorf("t0 = %d", got)
	}
}

const (
	minInt64 = -1 << 63
	maxInt64 = 1<<63 - 1
)
