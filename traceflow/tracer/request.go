package tracer

import (
	"crypto/rand"
	"fmt"
	"net/netip"
	"strings"

	"sluice/traceflow/cluster"
	"sluice/traceflow/crd"
)

// Endpoints resolves antctl's -S and -D arguments into a Traceflow spec.
// -S is "ns/pod" or "pod" (namespace default). -D is "ns/name", "name" or
// an IP; a name is a Pod if such a Pod exists, otherwise a Service.
func Endpoints(st *cluster.State, src, dst string) (crd.Source, crd.Destination, error) {
	var s crd.Source
	var d crd.Destination
	if src == "" {
		return s, d, fmt.Errorf("please provide source")
	}
	if dst == "" {
		return s, d, fmt.Errorf("please provide destination")
	}
	if _, err := netip.ParseAddr(src); err == nil {
		return s, d, fmt.Errorf("source %s: an IP source is only for live-traffic traces, which a model cannot run", src)
	}
	s.Namespace, s.Pod = splitName(src)
	if ip, err := netip.ParseAddr(dst); err == nil {
		d.IP = ip.String()
		return s, d, nil
	}
	ns, name := splitName(dst)
	d.Namespace = ns
	if st.Pod(ns, name) != nil {
		d.Pod = name
	} else {
		d.Service = name
	}
	return s, d, nil
}

func splitName(s string) (ns, name string) {
	if ns, name, ok := strings.Cut(s, "/"); ok {
		return ns, name
	}
	return "default", s
}

// Name builds antctl's trace name: "<src>-to-<dst>-<8 random chars>".
func Name(s crd.Source, d crd.Destination) string {
	part := func(ns, name, ip string) string {
		switch {
		case name != "" && ns != "":
			return ns + "-" + name
		case name != "":
			return name
		case ip != "":
			return strings.ReplaceAll(strings.ReplaceAll(ip, "::", "-"), ":", "-")
		}
		return "any"
	}
	dn := d.Pod
	if dn == "" {
		dn = d.Service
	}
	const letters = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 8)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on supported platforms
	for i := range b {
		b[i] = letters[int(b[i])%len(letters)]
	}
	return part(s.Namespace, s.Pod, s.IP) + "-to-" + part(d.Namespace, dn, d.IP) + "-" + string(b)
}
