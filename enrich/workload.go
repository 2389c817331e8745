package enrich

import "strings"

// Workload is what runs a Pod: the kind and name of the object that
// controls it, a ReplicaSet read as its Deployment.
type Workload struct {
	// Kind is "Deployment", "ReplicaSet" (one no Deployment made),
	// "StatefulSet", "DaemonSet", "Job", or another controller's kind;
	// "" when the Pod has no controller or it is not known.
	Kind string
	Name string
}

// Known reports whether the workload was read from the Pod's controller.
func (w Workload) Known() bool { return w.Kind != "" && w.Name != "" }

// podTemplateHashLabel is the label a Deployment puts on the Pods (and in
// the name) of each of its ReplicaSets.
const podTemplateHashLabel = "pod-template-hash"

// workloadOf names the workload of a Pod from its controller owner
// reference (kind and name) and its labels. A Deployment's ReplicaSet is
// named "<deployment>-<pod-template-hash>" and its Pods carry that hash as
// a label, so the Deployment is the ReplicaSet's name without it; the
// hash's alphabet has no digit guarantee, which is why Pod names alone
// cannot tell it.
func workloadOf(kind, name string, labels map[string]string) Workload {
	if kind == "" || name == "" {
		return Workload{}
	}
	if kind == "ReplicaSet" {
		if h := labels[podTemplateHashLabel]; h != "" {
			if d, ok := strings.CutSuffix(name, "-"+h); ok && d != "" {
				return Workload{Kind: "Deployment", Name: d}
			}
		}
	}
	return Workload{Kind: kind, Name: name}
}
