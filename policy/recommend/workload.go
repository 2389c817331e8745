package recommend

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/labels"

	"sluice/traceflow/cluster"
)

// Workload is a set of Pods grouped by their owner, and the labels that
// select them.
type Workload struct {
	Namespace string
	// Kind is Deployment, StatefulSet, DaemonSet, Job, ReplicaSet (one
	// without a Deployment), or Pods for Pods without an owner, grouped
	// by their labels.
	Kind, Name string
	Pods       []*cluster.Pod
	// Selector selects the workload's Pods in its namespace. Extra are the
	// Pods it also selects when no labels tell the workload apart (empty
	// when the selector is exact).
	Selector map[string]string
	Extra    []*cluster.Pod
}

// ID is "namespace/kind/name".
func (w *Workload) ID() string { return w.Namespace + "/" + w.Kind + "/" + w.Name }

// Describe is "Kind namespace/name", e.g. "Deployment web/cart"; Pods
// without an owner are "Pods web/cart".
func (w *Workload) Describe() string { return w.Kind + " " + w.Namespace + "/" + w.Name }

// volatileLabels change between a workload's Pods (or revisions), so they
// never make a workload selector.
var volatileLabels = map[string]bool{
	"pod-template-hash":                        true,
	"controller-revision-hash":                 true,
	"statefulset.kubernetes.io/pod-name":       true,
	"apps.kubernetes.io/pod-index":             true,
	"batch.kubernetes.io/job-completion-index": true,
	"pod-template-generation":                  true,
}

// preferredKeys are tried first as one-label selectors.
var preferredKeys = []string{"app.kubernetes.io/name", "app", "k8s-app", "name"}

type podOwner struct{ kind, name string }

// owners reads each Pod's controlling owner from the raw objects (the
// model's Pod keeps no owner references).
func owners(objs []cluster.Object) map[string]podOwner {
	out := map[string]podOwner{}
	for _, o := range objs {
		if o.Kind != "Pod" || o.APIVersion != "v1" {
			continue
		}
		var p struct {
			Metadata struct {
				Labels          map[string]string `json:"labels"`
				OwnerReferences []struct {
					Kind       string `json:"kind"`
					Name       string `json:"name"`
					Controller *bool  `json:"controller"`
				} `json:"ownerReferences"`
			} `json:"metadata"`
		}
		if json.Unmarshal(o.Raw, &p) != nil {
			continue
		}
		refs := p.Metadata.OwnerReferences
		if len(refs) == 0 {
			continue
		}
		ref := refs[0]
		for _, r := range refs {
			if r.Controller != nil && *r.Controller {
				ref = r
				break
			}
		}
		own := podOwner{ref.Kind, ref.Name}
		// A Deployment's Pods belong to a ReplicaSet named after the
		// Deployment and the template hash.
		if h := p.Metadata.Labels["pod-template-hash"]; ref.Kind == "ReplicaSet" && h != "" && strings.HasSuffix(ref.Name, "-"+h) {
			own = podOwner{"Deployment", strings.TrimSuffix(ref.Name, "-"+h)}
		}
		out[o.Namespace+"/"+o.Name] = own
	}
	return out
}

// Workloads groups the state's Pods (not hostNetwork ones) by owner, and
// finds each group's selector.
func Workloads(st *cluster.State, objs []cluster.Object) []*Workload {
	own := owners(objs)
	byID := map[string]*Workload{}
	var out []*Workload
	for _, p := range st.Pods {
		if p.HostNetwork {
			continue
		}
		o, ok := own[p.Key()]
		if !ok {
			o = podOwner{"Pods", labelKey(p.Labels)}
		}
		id := p.Namespace + "/" + o.kind + "/" + o.name
		w := byID[id]
		if w == nil {
			w = &Workload{Namespace: p.Namespace, Kind: o.kind, Name: o.name}
			byID[id] = w
			out = append(out, w)
		}
		w.Pods = append(w.Pods, p)
	}
	names := map[string]int{}
	for _, w := range out {
		if w.Kind == "Pods" {
			w.Name = ownerlessName(w)
			n := names[w.Namespace+"/"+w.Name]
			names[w.Namespace+"/"+w.Name]++
			if n > 0 {
				w.Name = fmt.Sprintf("%s-%d", w.Name, n+1)
			}
		}
		w.Selector, w.Extra = selector(st, w)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID() < out[j].ID() })
	return out
}

// labelKey is a Pod's stable labels as one string, grouping Pods without
// an owner.
func labelKey(l map[string]string) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(l)) {
		if !volatileLabels[k] {
			fmt.Fprintf(&b, "%s=%s,", k, l[k])
		}
	}
	return b.String()
}

func ownerlessName(w *Workload) string {
	for _, k := range preferredKeys {
		if v := w.Pods[0].Labels[k]; v != "" {
			return v
		}
	}
	if len(w.Pods) == 1 {
		return w.Pods[0].Name
	}
	return "pods"
}

// selector finds the labels that select exactly w's Pods in their
// namespace: one preferred label, else any one label, else all the labels
// the Pods share. When even those select more Pods, the others are
// returned as extra.
func selector(st *cluster.State, w *Workload) (map[string]string, []*cluster.Pod) {
	common := map[string]string{}
	for k, v := range w.Pods[0].Labels {
		if !volatileLabels[k] {
			common[k] = v
		}
	}
	for _, p := range w.Pods[1:] {
		for k, v := range common {
			if p.Labels[k] != v {
				delete(common, k)
			}
		}
	}
	members := map[*cluster.Pod]bool{}
	for _, p := range w.Pods {
		members[p] = true
	}
	extra := func(sel map[string]string) []*cluster.Pod {
		var out []*cluster.Pod
		s := labels.SelectorFromSet(sel)
		for _, p := range st.Pods {
			if p.Namespace == w.Namespace && !p.HostNetwork && !members[p] && s.Matches(labels.Set(p.Labels)) {
				out = append(out, p)
			}
		}
		return out
	}
	keys := slices.Sorted(maps.Keys(common))
	var try []string
	for _, k := range preferredKeys {
		if _, ok := common[k]; ok {
			try = append(try, k)
		}
	}
	try = append(try, keys...)
	for _, k := range try {
		sel := map[string]string{k: common[k]}
		if len(extra(sel)) == 0 {
			return sel, nil
		}
	}
	return common, extra(common)
}
