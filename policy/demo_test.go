package policy_test

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"sluice/demo"
	"sluice/policy/flowsrc"
	"sluice/policy/observed"
	"sluice/policy/recommend"
	"sluice/policy/verify"
	"sluice/traceflow/cluster"
	"sluice/traceflow/crd"
	"sluice/traceflow/modelrun"
	"sluice/traceflow/pipeline"
	"sluice/traceflow/tracer"
)

// demoRun is one run of the demo shared by the tests: its flow log.
var demoRun struct {
	once sync.Once
	log  string
	err  error
}

// demoFlowLog runs `sluice demo --out DIR` for a few seconds (once per
// test binary) and returns DIR/flows.log.
func demoFlowLog(t testing.TB) string {
	t.Helper()
	demoRun.once.Do(func() {
		dir, err := tempDir()
		if err != nil {
			demoRun.err = err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		var out bytes.Buffer
		_, err = demo.Run(ctx, demo.Options{Duration: 8 * time.Second, Rate: 200, Out: dir, Stdout: &out, Seed: 7})
		if err != nil {
			demoRun.err = errors.Join(err, errors.New(out.String()))
		}
		demoRun.log = filepath.Join(dir, "flows.log")
	})
	if demoRun.err != nil {
		t.Fatalf("demo: %v", demoRun.err)
	}
	return demoRun.log
}

func demoObjects(t testing.TB) []cluster.Object {
	t.Helper()
	objs, err := cluster.ReadPath(context.Background(), "../examples/cluster")
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func buildModel(t testing.TB, objs []cluster.Object) *pipeline.Model {
	t.Helper()
	cfg, err := modelrun.DefaultSettings().Config(crd.FirstTraceflowTag)
	if err != nil {
		t.Fatal(err)
	}
	m, _, err := modelrun.Model(context.Background(), objs, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func readConns(t testing.TB, path string) []*observed.Conn {
	t.Helper()
	src, err := flowsrc.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	set := observed.NewSet(0)
	if err := src.Read(context.Background(), time.Time{}, func(r *flowsrc.Record) error { set.Add(r); return nil }); err != nil {
		t.Fatal(err)
	}
	return set.Conns()
}

// candidates renders a recommendation as YAML and reads it back, as a
// user's files would be.
func candidates(t testing.TB, res *recommend.Result) []cluster.Object {
	t.Helper()
	var b bytes.Buffer
	if err := res.WriteYAML(&b); err != nil {
		t.Fatal(err)
	}
	objs, err := cluster.ParseObjects(b.Bytes(), "recommended.yaml")
	if err != nil {
		t.Fatalf("%v\n%s", err, b.String())
	}
	return objs
}

func decide(t testing.TB, m *pipeline.Model, c *observed.Conn) *tracer.Verdict {
	t.Helper()
	v, err := tracer.Decide(context.Background(), m, tracer.Connection{Src: c.Src, Dst: c.Dst, Proto: c.Proto, SrcPort: c.SrcPort, DstPort: c.DstPort})
	if err != nil {
		t.Fatalf("%v: %v", c.Key, err)
	}
	return v
}

// TestDemoRecommendVerify: from a demo run's records, in each isolation,
// the recommendations block no observed allowed connection, every denied
// connection stays denied, and an independent NetworkPolicy checker agrees
// that they allow every connection they carry and deny the ones the
// Kubernetes policies denied.
func TestDemoRecommendVerify(t *testing.T) {
	log := demoFlowLog(t)
	objs := demoObjects(t)
	before := buildModel(t, objs)
	conns := readConns(t, log)
	if len(conns) < 20 {
		t.Fatalf("the demo run gave %d distinct connections; want a realistic set", len(conns))
	}
	var deniedNow []*observed.Conn
	for _, c := range conns {
		if c.Denied > 0 || decide(t, before, c).Denied {
			deniedNow = append(deniedNow, c)
		}
	}
	if len(deniedNow) == 0 {
		t.Fatal("the demo run has no denied connection; the test needs some")
	}
	t.Logf("%d distinct connections, %d of them denied", len(conns), len(deniedNow))
	for _, format := range []string{recommend.FormatK8s, recommend.FormatAntrea} {
		for _, iso := range []string{recommend.IsolationBoth, recommend.IsolationIngress, recommend.IsolationEgress} {
			for _, dd := range []string{recommend.DenyNamespace, recommend.DenyWorkload} {
				t.Run(format+"/"+iso+"/"+dd, func(t *testing.T) {
					ctx := context.Background()
					res, err := recommend.Recommend(ctx, before, objs, conns, recommend.Options{Isolation: iso, DefaultDeny: dd, Format: format})
					if err != nil {
						t.Fatal(err)
					}
					if res.Carried+res.Skipped.Denied != len(conns) || res.Carried == 0 {
						t.Errorf("carried %d, skipped %+v, of %d connections", res.Carried, res.Skipped, len(conns))
					}
					cands := candidates(t, res)
					after := buildModel(t, cluster.Overlay(objs, cands))
					rep, err := verify.Verify(ctx, before, after, cands, conns, verify.Options{})
					if err != nil {
						t.Fatal(err)
					}
					if rep.Blocks() || len(rep.NewlyAllowed) != 0 {
						t.Errorf("newly blocked %+v, newly allowed %+v", rep.NewlyBlocked, rep.NewlyAllowed)
					}
					if rep.Unchanged != len(conns) {
						t.Errorf("%d unchanged of %d", rep.Unchanged, len(conns))
					}
					for _, c := range deniedNow {
						if !decide(t, after, c).Denied {
							t.Errorf("%s: denied before, allowed with the recommendations", recommend.ConnText(c))
						}
					}
					if format == recommend.FormatAntrea {
						for _, c := range cands {
							if c.APIVersion != crd.GroupVersion {
								t.Errorf("--format antrea wrote %s %s", c.APIVersion, c.Describe())
							}
						}
						return // the checker knows Kubernetes NetworkPolicies only
					}
					// The independent check: the cluster's Kubernetes
					// NetworkPolicies with the recommendations.
					chk := newNPCheck(t, cluster.Overlay(objs, cands))
					carried := 0
					for _, c := range conns {
						ok := chk.allowed(c.Src, c.Dst, k8sProto(c.Proto), int32(c.DstPort))
						switch {
						case slices.Contains(deniedNow, c):
							// Drops by Antrea-native policies are not the
							// checker's to judge; Kubernetes isolation is.
							if ok && c.DeniedBy != "" && !isAntrea(before, c) {
								t.Errorf("%s: denied by %s, the checker allows it with the recommendations", recommend.ConnText(c), c.DeniedBy)
							}
						case !ok:
							t.Errorf("%s: carried, but the independent checker denies it", recommend.ConnText(c))
						default:
							carried++
						}
					}
					if carried != res.Carried {
						t.Errorf("the checker allows %d carried connections, the recommendation carried %d", carried, res.Carried)
					}
					if iso == recommend.IsolationBoth && rep.SurfaceTotal == 0 {
						t.Error("no unobserved surface: the /24 CIDRs alone allow more than was observed")
					}
				})
			}
		}
	}
}

// isAntrea says an Antrea-native policy decides c.
func isAntrea(m *pipeline.Model, c *observed.Conn) bool {
	v, err := tracer.Decide(context.Background(), m, tracer.Connection{Src: c.Src, Dst: c.Dst, Proto: c.Proto, SrcPort: c.SrcPort, DstPort: c.DstPort})
	if err != nil {
		return false
	}
	for _, d := range []*tracer.Decision{v.Egress, v.Ingress} {
		if d != nil && (d.Rule.PolicyType == crd.AntreaClusterPolicyType || d.Rule.PolicyType == crd.AntreaNetworkPolicyType) {
			return true
		}
	}
	return false
}

// TestRemovedRule: removing any one rule of a recommended policy makes
// verify name exactly the connections that rule carried, but for those
// another policy (one of the cluster's own) also allows, as the
// independent checker finds them.
func TestRemovedRule(t *testing.T) {
	log := demoFlowLog(t)
	objs := demoObjects(t)
	before := buildModel(t, objs)
	conns := readConns(t, log)
	ctx := context.Background()
	res, err := recommend.Recommend(ctx, before, objs, conns, recommend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	tried, blocking := 0, 0
	for oi, o := range res.Objects {
		for _, dir := range []string{"ingress", "egress"} {
			rules := o.Ingress
			if dir == "egress" {
				rules = o.Egress
			}
			for ri, rule := range rules {
				tried++
				np := o.Policy.DeepCopy()
				if dir == "ingress" {
					np.Spec.Ingress = slices.Delete(np.Spec.Ingress, ri, ri+1)
				} else {
					np.Spec.Egress = slices.Delete(np.Spec.Egress, ri, ri+1)
				}
				cut := *res
				cut.Objects = slices.Clone(res.Objects)
				cut.Objects[oi] = &recommend.Object{Policy: np, Workload: o.Workload}
				cands := candidates(t, &cut)
				after := buildModel(t, cluster.Overlay(objs, cands))
				rep, err := verify.Verify(ctx, before, after, cands, conns, verify.Options{})
				if err != nil {
					t.Fatal(err)
				}
				var got, want []observed.Key
				for _, f := range rep.NewlyBlocked {
					got = append(got, f.Key())
					if f.Rule == "" {
						t.Errorf("%s/%s %s[%d]: %s -> %s blocked without a rule named", np.Namespace, np.Name, dir, ri, f.Source, f.Destination)
					}
				}
				chk := newNPCheck(t, cluster.Overlay(objs, cands))
				for _, c := range rule.Conns {
					if !chk.allowed(c.Src, c.Dst, k8sProto(c.Proto), int32(c.DstPort)) {
						want = append(want, c.Key)
					}
				}
				if len(want) > 0 {
					blocking++
				}
				slices.SortFunc(got, observed.Compare)
				slices.SortFunc(want, observed.Compare)
				if !slices.Equal(got, want) {
					t.Errorf("%s/%s without %s[%d] (%s): blocks %v, want the rule's connections %v", np.Namespace, np.Name, dir, ri, rule.Peer, got, want)
				}
			}
		}
	}
	if tried < 10 || blocking < tried/2 {
		t.Errorf("%d rules tried, %d of them carried connections no other policy allows; want most of at least 10", tried, blocking)
	}
	t.Logf("%d rules removed one at a time, %d carried connections no other policy allows", tried, blocking)
}
