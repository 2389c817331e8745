package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sluice/examples"
	"sluice/exporter/source"
	"sluice/exporter/source/synthetic"
	"sluice/traceflow/cluster"
	"sluice/traceflow/crd"
	"sluice/traceflow/modelrun"
	"sluice/traceflow/pipeline"
	"sluice/traceflow/tracer"
)

// TalksTo is the Pod annotation listing what a Pod connects to:
// "ns/service:port", "ns/label=value:port" or "ip:port", comma-separated,
// each with an optional "/udp".
const TalksTo = "demo.sluice.io/talks-to"

// model is the demo cluster: its objects, its Traceflow model, and the
// traffic its Pods' annotations ask for, split by what the policies allow.
type model struct {
	objs   []cluster.Object
	tf     *pipeline.Model
	routes []route
	denied []Denied
	// deniedRoutes are the denied routes: their connections are made too,
	// and never answered.
	deniedRoutes []route
}

// route is one allowed kind of connection.
type route struct {
	client *cluster.Pod
	proto  uint8
	dst    netip.AddrPort
	// endpoints answer for a Service's ClusterIP.
	endpoints []netip.AddrPort
	// traceDst and spec are the route as a Traceflow destination and
	// packet ("ns/pod", "ns/service" or an IP; "tcp,tcp_dst=443").
	traceDst, spec string
	external       bool
}

// Denied is traffic an annotation asks for that a policy drops.
type Denied struct {
	Client, Target string
	// By is the policy and rule (or default rule) that drops it.
	By string
}

// loadObjects reads the cluster: dir when given, else the bundled example.
func loadObjects(ctx context.Context, dir string) ([]cluster.Object, error) {
	if dir != "" {
		return cluster.ReadPath(ctx, dir)
	}
	fsys := examples.Cluster()
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return nil, fmt.Errorf("demo: the bundled cluster: %w", err)
	}
	var out []cluster.Object
	for _, e := range entries {
		if ext := path.Ext(e.Name()); e.IsDir() || (ext != ".yaml" && ext != ".yml" && ext != ".json") {
			continue
		}
		data, err := fs.ReadFile(fsys, e.Name())
		if err != nil {
			return nil, fmt.Errorf("demo: the bundled cluster: %w", err)
		}
		objs, err := cluster.ParseObjects(data, e.Name())
		if err != nil {
			return nil, err
		}
		out = append(out, objs...)
	}
	return out, nil
}

// buildModel validates the objects, builds the datapath model and works
// out the traffic, tracing each route once to learn whether policies let
// it through.
func buildModel(ctx context.Context, objs []cluster.Object) (*model, []string, error) {
	st, probs := cluster.Build(objs)
	if err := probs.Err(); err != nil {
		return nil, nil, fmt.Errorf("demo: cluster: %w", err)
	}
	if len(st.Nodes) == 0 {
		return nil, nil, errors.New("demo: cluster: no Node")
	}
	cfg := pipeline.DefaultConfig()
	cfg.Tag = crd.FirstTraceflowTag
	tfm, more, err := pipeline.Build(ctx, st, cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("demo: building the datapath model: %w", err)
	}
	var warnings []string
	for _, p := range append(probs, more...) {
		warnings = append(warnings, p.String())
	}
	m := &model{objs: objs, tf: tfm}
	annotations, err := podAnnotations(objs)
	if err != nil {
		return nil, nil, err
	}
	for _, p := range st.Pods {
		if p.HostNetwork {
			continue
		}
		list := annotations[p.Key()]
		for t := range strings.SplitSeq(list, ",") {
			if t = strings.TrimSpace(t); t == "" {
				continue
			}
			rs, err := resolve(st, p, t)
			if err != nil {
				return nil, nil, fmt.Errorf("demo: Pod %s: annotation %s: %q: %w", p.Key(), TalksTo, t, err)
			}
			for _, r := range rs {
				by, err := m.verdict(ctx, r)
				if err != nil {
					return nil, nil, fmt.Errorf("demo: tracing %s to %s: %w", p.Key(), r.traceDst, err)
				}
				if by != "" {
					m.denied = append(m.denied, Denied{Client: p.Key(), Target: r.traceDst + " " + r.spec, By: by})
					m.deniedRoutes = append(m.deniedRoutes, r)
					continue
				}
				m.routes = append(m.routes, r)
			}
		}
	}
	if len(m.routes) == 0 {
		return nil, nil, fmt.Errorf("demo: cluster: no Pod has allowed traffic (annotation %s)", TalksTo)
	}
	return m, warnings, nil
}

func podAnnotations(objs []cluster.Object) (map[string]string, error) {
	out := map[string]string{}
	for _, o := range objs {
		if o.Kind != "Pod" {
			continue
		}
		var meta struct {
			Metadata struct {
				Annotations map[string]string `json:"annotations"`
			} `json:"metadata"`
		}
		if err := json.Unmarshal(o.Raw, &meta); err != nil {
			return nil, fmt.Errorf("demo: %s: %w", o.Describe(), err)
		}
		ns := o.Namespace
		if ns == "" {
			ns = "default"
		}
		if v := meta.Metadata.Annotations[TalksTo]; v != "" {
			out[ns+"/"+o.Name] = v
		}
	}
	return out, nil
}

// resolve turns one annotation entry into routes: one per selected Pod,
// one for a Service port, one for an outside address.
func resolve(st *cluster.State, client *cluster.Pod, target string) ([]route, error) {
	proto, kw := source.ProtoTCP, "tcp"
	if rest, ok := strings.CutSuffix(target, "/udp"); ok {
		target, proto, kw = rest, source.ProtoUDP, "udp"
	} else {
		target = strings.TrimSuffix(target, "/tcp")
	}
	i := strings.LastIndexByte(target, ':')
	if i < 0 {
		return nil, errors.New("no port")
	}
	port, err := strconv.ParseUint(target[i+1:], 10, 16)
	if err != nil || port == 0 {
		return nil, fmt.Errorf("port %q is not a number from 1 to 65535", target[i+1:])
	}
	host := target[:i]
	spec := fmt.Sprintf("%s,%s_dst=%d", kw, kw, port)
	cip, ok := client.IP(false)
	if !ok {
		return nil, errors.New("the client has no IPv4 address")
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		r := route{client: client, proto: proto, dst: netip.AddrPortFrom(ip, uint16(port)), traceDst: ip.String(), spec: spec,
			external: st.NodeForPodIP(ip) == nil}
		return []route{r}, nil
	}
	ns, name, ok := strings.Cut(host, "/")
	if !ok {
		return nil, errors.New("want ns/service, ns/label=value or an IP address before the port")
	}
	if key, value, isSel := strings.Cut(name, "="); isSel {
		pods, err := st.SelectPods(&metav1.LabelSelector{MatchLabels: map[string]string{key: value}}, nil, ns)
		if err != nil {
			return nil, err
		}
		var out []route
		for _, p := range pods {
			ip, ok := p.IP(false)
			if !ok || p == client || ip == cip {
				continue
			}
			out = append(out, route{client: client, proto: proto, dst: netip.AddrPortFrom(ip, uint16(port)), traceDst: p.Key(), spec: spec})
		}
		if len(out) == 0 {
			return nil, errors.New("selects no other Pod")
		}
		return out, nil
	}
	svc := st.Service(ns, name)
	if svc == nil {
		return nil, fmt.Errorf("no Service %s/%s", ns, name)
	}
	var vip netip.Addr
	for _, ip := range svc.ClusterIPs {
		if ip.Is4() {
			vip = ip
			break
		}
	}
	if !vip.IsValid() {
		return nil, errors.New("the Service has no IPv4 ClusterIP")
	}
	for _, sp := range svc.Ports {
		if sp.Port != uint16(port) || !strings.EqualFold(string(sp.Protocol), kw) {
			continue
		}
		r := route{client: client, proto: proto, dst: netip.AddrPortFrom(vip, uint16(port)), traceDst: svc.Key(), spec: spec}
		for _, ep := range svc.Endpoints {
			if tp, ok := ep.Ports[sp.Name]; ok && ep.IP.Is4() {
				r.endpoints = append(r.endpoints, netip.AddrPortFrom(ep.IP, tp))
			}
		}
		if len(r.endpoints) == 0 {
			return nil, errors.New("the Service port has no ready endpoint")
		}
		return []route{r}, nil
	}
	return nil, fmt.Errorf("the Service has no %s port %d", kw, port)
}

// trace runs one Traceflow of r over the model.
func (m *model) trace(ctx context.Context, r route) (*crd.Traceflow, error) {
	tf, err := modelrun.NewTraceflow(m.tf.State, r.client.Key(), r.traceDst, r.spec)
	if err != nil {
		return nil, err
	}
	t, err := tracer.Run(ctx, m.tf, tf, tracer.Options{})
	if err != nil {
		return nil, err
	}
	return t.Traceflow, nil
}

// verdict is "" when r's packet is delivered (or leaves the cluster), else
// what stopped it.
func (m *model) verdict(ctx context.Context, r route) (string, error) {
	tf, err := m.trace(ctx, r)
	if err != nil {
		return "", err
	}
	for _, res := range tf.Status.Results {
		for _, o := range res.Observations {
			if o.Action != crd.ActionDropped && o.Action != crd.ActionRejected {
				continue
			}
			by := o.NetworkPolicy
			if o.NetworkPolicyRule != "" {
				by += " rule " + o.NetworkPolicyRule
			}
			if by == "" {
				by = o.ComponentInfo
			}
			return fmt.Sprintf("%s by %s (%s)", o.Action, by, res.Node), nil
		}
	}
	if tf.Status.Phase != crd.PhaseSucceeded {
		return fmt.Sprintf("trace %s: %s", tf.Status.Phase, tf.Status.Reason), nil
	}
	return "", nil
}

// egressRoute picks the route the final trace follows: to the outside
// from a Pod whose Egress IP is on another Node, else any route out
// through an Egress, else the first route.
func (m *model) egressRoute() route {
	st := m.tf.State
	best, rank := m.routes[0], 0
	for _, r := range m.routes {
		if !r.external {
			continue
		}
		e := st.EffectiveEgress(r.client)
		if e == nil {
			continue
		}
		if _, node, ok := cluster.EgressAssignment(e); ok && node != r.client.Node {
			return r
		} else if ok && rank < 1 {
			best, rank = r, 1
		}
	}
	return best
}

// syntheticRoutes are the routes as the synthetic source takes them: the
// allowed ones, and the denied ones, whose connections get no answer.
func (m *model) syntheticRoutes() []synthetic.Route {
	out := make([]synthetic.Route, 0, len(m.routes)+len(m.deniedRoutes))
	for _, r := range m.routes {
		ip, _ := r.client.IP(false)
		out = append(out, synthetic.Route{Client: ip, Proto: r.proto, Dst: r.dst, Endpoints: r.endpoints})
	}
	for _, r := range m.deniedRoutes {
		ip, _ := r.client.IP(false)
		out = append(out, synthetic.Route{Client: ip, Proto: r.proto, Dst: r.dst, Endpoints: r.endpoints, Denied: true})
	}
	return out
}

// writeInventory writes the cluster's Pods, Nodes and Services as one
// JSON List, the metadata file the exporters and the aggregator read, so
// that they know exactly the Pods the traffic comes from.
func (m *model) writeInventory(dir string) (string, error) {
	var items []json.RawMessage
	for _, o := range m.objs {
		if o.APIVersion == "v1" && (o.Kind == "Pod" || o.Kind == "Node" || o.Kind == "Service") {
			items = append(items, o.Raw)
		}
	}
	data, err := json.Marshal(struct {
		APIVersion string            `json:"apiVersion"`
		Kind       string            `json:"kind"`
		Items      []json.RawMessage `json:"items"`
	}{"v1", "List", items})
	if err != nil {
		return "", fmt.Errorf("demo: inventory: %w", err)
	}
	p := filepath.Join(dir, "inventory.json")
	if err := os.WriteFile(p, data, 0o600); err != nil {
		return "", fmt.Errorf("demo: inventory: %w", err)
	}
	return p, nil
}
