package kubetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
)

// Objects splits a multi-document YAML stream into objects, leaving out
// empty documents.
func Objects(manifest []byte) ([]*unstructured.Unstructured, error) {
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(manifest), 4096)
	var out []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, err
		}
		if len(m) == 0 {
			continue
		}
		out = append(out, &unstructured.Unstructured{Object: m})
	}
}

// ApplyResult is one object's server-side apply.
type ApplyResult struct {
	Object *unstructured.Unstructured
	Err    error
}

// ServerSideApply applies every object with server-side apply (field
// manager "sluice-test", forcing conflicts), Namespaces and
// CustomResourceDefinitions first (waiting for CRDs to be established), and
// returns each object's outcome in the order applied.
func (c *Cluster) ServerSideApply(ctx context.Context, objs []*unstructured.Unstructured) ([]ApplyResult, error) {
	dc, err := discovery.NewDiscoveryClientForConfig(c.Admin)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(c.Admin)
	if err != nil {
		return nil, err
	}
	cached := memory.NewMemCacheClient(dc)
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(cached)
	rank := func(o *unstructured.Unstructured) int {
		switch o.GetKind() {
		case "Namespace":
			return 0
		case "CustomResourceDefinition":
			return 1
		}
		return 2
	}
	var out []ApplyResult
	for pass := 0; pass <= 2; pass++ {
		for _, o := range objs {
			if rank(o) != pass {
				continue
			}
			out = append(out, ApplyResult{Object: o, Err: c.applyOne(ctx, mapper, dyn, o)})
		}
		if pass == 1 {
			if err := c.waitCRDs(ctx, dyn, objs); err != nil {
				return out, err
			}
			cached.Invalidate()
			mapper.Reset()
		}
	}
	return out, nil
}

func (c *Cluster) applyOne(ctx context.Context, mapper *restmapper.DeferredDiscoveryRESTMapper, dyn dynamic.Interface, o *unstructured.Unstructured) error {
	gvk := o.GroupVersionKind()
	m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return fmt.Errorf("%s %s: %w", gvk, o.GetName(), err)
	}
	body, err := o.MarshalJSON()
	if err != nil {
		return err
	}
	var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
	if m.Scope.Name() == "namespace" {
		ri = dyn.Resource(m.Resource).Namespace(o.GetNamespace())
	}
	force := true
	_, err = ri.Patch(ctx, o.GetName(), types.ApplyPatchType, body, metav1.PatchOptions{FieldManager: "sluice-test", Force: &force})
	if err != nil {
		return fmt.Errorf("%s %s/%s: %w", gvk.Kind, o.GetNamespace(), o.GetName(), err)
	}
	return nil
}

func (c *Cluster) waitCRDs(ctx context.Context, dyn dynamic.Interface, objs []*unstructured.Unstructured) error {
	crds := dyn.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	for _, o := range objs {
		if o.GetKind() != "CustomResourceDefinition" {
			continue
		}
		deadline := time.Now().Add(time.Minute)
		for {
			u, err := crds.Get(ctx, o.GetName(), metav1.GetOptions{})
			if err == nil && established(u) {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("CRD %s not established: %v", o.GetName(), err)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	return nil
}

func established(u *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == "Established" && m["status"] == "True" {
			return true
		}
	}
	return false
}
