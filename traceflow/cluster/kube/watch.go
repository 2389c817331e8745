package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"sluice/kubeinformers"
	"sluice/kubetrim"
	"sluice/traceflow/cluster"
	"sluice/traceflow/crd"
)

// WatchOptions configures a Watcher. The zero value gives the defaults.
type WatchOptions struct {
	// Logger receives start-up, sync and watch events, client-go's own
	// messages included; slog.Default() if nil.
	Logger *slog.Logger
	// Rediscover is how often discovery is asked again, while an Antrea
	// resource is not served, whether it is now; DefaultRediscover if
	// zero or negative.
	Rediscover time.Duration
	// IPPools also watches Antrea's IPPools and keeps the
	// ipam.antrea.io/ippools annotation of Namespaces and Pods, which
	// FlexibleIPAM (the bridging mode) reads, so that Objects gives what
	// Load gives; the Traceflow controller, which models the bridging
	// mode, sets it.
	IPPools bool
	// Informers, when set, is the process's informer factory, which the
	// typed informers then share (see package kubeinformers): its Pods
	// include finished ones (cluster.Build leaves them out) and keep the
	// ippools annotation (dropped here without IPPools). Its owner shuts
	// it down.
	Informers *kubeinformers.Shared
}

// ErrNotSynced is WaitObjects' error when its context ends before every
// watched resource has been listed.
var ErrNotSynced = errors.New("the watch of the cluster has not listed every resource yet")

// DefaultRediscover is how often a Watcher looks for Antrea CRDs installed
// after it started.
const DefaultRediscover = time.Minute

// Watcher follows, through informers, the objects Load lists: the typed
// clientset's Namespaces, Nodes, Pods (not finished ones), Services,
// EndpointSlices and NetworkPolicies, and the Antrea CRDs the server
// serves through dynamic informers. Objects returns them as Load does,
// from the informers' caches; Changed signals every change.
//
// The caches hold trimmed objects (no managed fields or annotations, a
// Pod's and a Node's status cut to the addresses and phase, Antrea
// policies without status), so a large cluster costs little memory and
// status churn (Node heartbeats, Pod conditions) does not look like a
// change of the model's input.
//
// A CRD that is not served is a warning of Objects, as with Load, and is
// watched once discovery (asked again every Rediscover) says it is
// served; a resource whose list is refused (forbidden) makes Objects
// fail, naming it, until the informer's retried list succeeds.
type Watcher struct {
	client kubernetes.Interface
	dyn    dynamic.Interface
	log    *slog.Logger
	// rediscover: see WatchOptions.Rediscover.
	rediscover time.Duration
	// ippools: see WatchOptions.IPPools.
	ippools bool
	// shared: see WatchOptions.Informers.
	shared *kubeinformers.Shared

	changed chan struct{} // capacity 1

	// syncMu guards syncCh, which is closed and replaced whenever what
	// Objects would answer about the lists may have changed (start, a
	// first list done, a failed list), so that any number of WaitObjects
	// callers wake; object events do not touch it.
	syncMu sync.Mutex
	syncCh chan struct{}

	mu       sync.Mutex // guards kinds and probs, set once by Run
	kinds    []*watchKind
	probs    cluster.Problems
	started  bool
	running  atomic.Bool
	events   atomic.Uint64
	errCount atomic.Uint64
	// changes counts signals: each follows a change of what Objects
	// answers (see Changes).
	changes atomic.Uint64
}

// watchKind is one watched resource.
type watchKind struct {
	resource   string // as errors name it
	apiVersion string
	kind       string
	typed      bool // items lack apiVersion and kind
	quiet      bool // not served is no warning (see antreaResource)
	// dropIPPools removes the ippools annotation a shared cache keeps
	// and this Watcher does not want (WatchOptions.IPPools off).
	dropIPPools bool
	// sharedErrs: the informer is shared, and its watch errors reach
	// this kind through kubeinformers.Shared.
	sharedErrs bool
	informer   cache.SharedIndexInformer
	reg        cache.ResourceEventHandlerRegistration
	lastErr    atomic.Pointer[error]

	// encMu guards enc: each cached object's last encoding, by store key,
	// reused while its resourceVersion is the same, so that a trace over
	// a large, quiet cluster does not encode every object again.
	encMu sync.Mutex
	enc   map[string]encoded
}

type encoded struct {
	resourceVersion string
	obj             cluster.Object
}

// WatchStats are a Watcher's counters.
type WatchStats struct {
	// Events counts the add, update and delete notifications received.
	Events uint64
	// WatchErrors counts failed lists and dropped watches (the informers
	// retry them).
	WatchErrors uint64
	// Objects is the number of objects in the caches now.
	Objects int
	// Synced says every watched resource has been listed.
	Synced bool
}

// NewWatcher returns a Watcher reading through client and dyn; it holds
// nothing until Run has listed.
func NewWatcher(client kubernetes.Interface, dyn dynamic.Interface, o WatchOptions) *Watcher {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Rediscover <= 0 {
		o.Rediscover = DefaultRediscover
	}
	return &Watcher{client: client, dyn: dyn, log: o.Logger, rediscover: o.Rediscover, ippools: o.IPPools, shared: o.Informers,
		changed: make(chan struct{}, 1), syncCh: make(chan struct{})}
}

// syncChanged is closed at the next change of the lists' state.
func (w *Watcher) syncChanged() <-chan struct{} {
	w.syncMu.Lock()
	defer w.syncMu.Unlock()
	return w.syncCh
}

func (w *Watcher) signalSync() {
	w.syncMu.Lock()
	close(w.syncCh)
	w.syncCh = make(chan struct{})
	w.syncMu.Unlock()
}

// WaitObjects is Objects once every watched resource has been listed,
// waiting for that until ctx ends; it then fails with ErrNotSynced,
// wrapping what Objects says (the resources still waited for, or why
// their lists fail). It never answers from a half-filled cache.
func (w *Watcher) WaitObjects(ctx context.Context) ([]cluster.Object, cluster.Problems, error) {
	for {
		// Taken before asking, so that a change in between wakes us.
		ch := w.syncChanged()
		objs, probs, err := w.Objects()
		if err == nil {
			return objs, probs, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, probs, fmt.Errorf("%w: %w", ErrNotSynced, err)
		}
	}
}

// Changed is signalled (capacity one: several changes may come as one)
// after the caches changed or a resource finished its first list.
func (w *Watcher) Changed() <-chan struct{} { return w.changed }

// Changes counts the changes signalled so far (an update that changed
// nothing Objects answers is none). It is counted after the informer's
// cache took the change: a reader that reads Changes and then Objects
// has every change up to the count it read.
func (w *Watcher) Changes() uint64 { return w.changes.Load() }

func (w *Watcher) signal() {
	w.changes.Add(1)
	select {
	case w.changed <- struct{}{}:
	default:
	}
}

// Run asks discovery which Antrea resources are served, starts the
// informers and follows the cluster until ctx ends, then stops them. It
// may be called once. Failed lists and watches are counted, logged and
// retried by the informers; Run returns an error only when called twice
// or when ctx ends during discovery.
func (w *Watcher) Run(ctx context.Context) error {
	if !w.running.CompareAndSwap(false, true) {
		return errors.New("kube watcher: Run called more than once")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ictx := klog.NewContext(ctx, logr.FromSlogHandler(w.log.Handler()))

	served, err := servedAntrea(ctx, w.client)
	if err != nil {
		return err
	}
	typed := []struct {
		k   *watchKind
		get func(informers.SharedInformerFactory) cache.SharedIndexInformer
	}{
		{&watchKind{resource: "namespaces", apiVersion: "v1", kind: "Namespace"},
			func(f informers.SharedInformerFactory) cache.SharedIndexInformer {
				return f.Core().V1().Namespaces().Informer()
			}},
		{&watchKind{resource: "nodes", apiVersion: "v1", kind: "Node"},
			func(f informers.SharedInformerFactory) cache.SharedIndexInformer {
				return f.Core().V1().Nodes().Informer()
			}},
		{&watchKind{resource: "pods", apiVersion: "v1", kind: "Pod"}, func(f informers.SharedInformerFactory) cache.SharedIndexInformer {
			if w.shared != nil {
				return f.Core().V1().Pods().Informer() // every Pod: the Pod metadata cache wants finished ones too
			}
			return f.InformerFor(&corev1.Pod{}, func(c kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
				return coreinformers.NewFilteredPodInformer(c, metav1.NamespaceAll, resync, cache.Indexers{}, func(o *metav1.ListOptions) {
					// Finished Pods hold no interface; leave them on the server.
					o.FieldSelector = "status.phase!=Succeeded,status.phase!=Failed"
				})
			})
		}},
		{&watchKind{resource: "services", apiVersion: "v1", kind: "Service"},
			func(f informers.SharedInformerFactory) cache.SharedIndexInformer {
				return f.Core().V1().Services().Informer()
			}},
		{&watchKind{resource: "endpointslices.discovery.k8s.io", apiVersion: "discovery.k8s.io/v1", kind: "EndpointSlice"},
			func(f informers.SharedInformerFactory) cache.SharedIndexInformer {
				return f.Discovery().V1().EndpointSlices().Informer()
			}},
		{&watchKind{resource: "networkpolicies.networking.k8s.io", apiVersion: "networking.k8s.io/v1", kind: "NetworkPolicy"},
			func(f informers.SharedInformerFactory) cache.SharedIndexInformer {
				return f.Networking().V1().NetworkPolicies().Informer()
			}},
	}
	var factory informers.SharedInformerFactory // our own, when not shared
	if w.shared == nil {
		factory = informers.NewSharedInformerFactoryWithOptions(w.client, 0, informers.WithTransform(trimTyped(w.ippools)))
	}
	var kinds []*watchKind
	for _, t := range typed {
		k := t.k
		k.typed = true
		if w.shared != nil {
			k.dropIPPools = !w.ippools
			inf, err := w.shared.Informer(k.resource, t.get, w.watchErrorHandler(k))
			if err != nil {
				return fmt.Errorf("kube watcher: %s informer: %w", k.resource, err)
			}
			k.informer, k.sharedErrs = inf, true
		} else {
			k.informer = t.get(factory)
		}
		kinds = append(kinds, k)
	}
	dfactory := dynamicinformer.NewDynamicSharedInformerFactory(w.dyn, 0)
	var missing []antreaResource // not served at start
	for _, r := range antreaResources() {
		if r.kind == crd.KindIPPool && !w.ippools {
			// FlexibleIPAM needs the bridging mode, which the exporter's
			// policy model does not model, and the ippools annotations
			// the caches drop unless asked for (WatchOptions.IPPools).
			continue
		}
		if served != nil && !served[r.resource] {
			missing = append(missing, r)
			continue
		}
		k, err := w.antreaKind(dfactory, r)
		if err != nil {
			return err
		}
		kinds = append(kinds, k)
	}
	for _, k := range kinds {
		if err := w.register(k); err != nil {
			return err
		}
	}
	w.mu.Lock()
	w.kinds, w.probs, w.started = kinds, missingProblems(missing), true
	w.mu.Unlock()
	w.signalSync()

	w.log.InfoContext(ctx, "kubernetes: watching the cluster state", "resources", len(kinds), "not_served", len(missing))
	if w.shared != nil {
		w.shared.Start(ictx)
	} else {
		factory.StartWithContext(ictx)
	}
	dfactory.Start(ictx.Done())
	// Signal each resource's first list, so that a consumer waiting for
	// all of them hears of the last.
	var wg sync.WaitGroup
	signalSynced := func(k *watchKind) {
		wg.Go(func() {
			select {
			case <-k.reg.HasSyncedChecker().Done():
				w.signal()
				w.signalSync()
			case <-ctx.Done():
			}
		})
	}
	for _, k := range kinds {
		signalSynced(k)
	}
	// Antrea's CRDs installed after the start are watched from the next
	// discovery on.
	t := time.NewTicker(w.rediscover)
	defer t.Stop()
	for len(missing) > 0 {
		select {
		case <-ctx.Done():
		case <-t.C:
			added, err := w.addServed(ctx, dfactory, &missing)
			if err != nil {
				w.log.WarnContext(ctx, "kubernetes: cannot watch a newly served Antrea resource", "err", err)
			}
			if len(added) > 0 {
				dfactory.Start(ictx.Done())
				for _, k := range added {
					signalSynced(k)
				}
				w.signal()
			}
			continue
		}
		break
	}
	<-ctx.Done()
	wg.Wait()
	if factory != nil {
		factory.Shutdown()
	}
	dfactory.Shutdown()
	return nil
}

// addServed asks discovery again and watches the resources of missing
// that are served now, removing them from it.
func (w *Watcher) addServed(ctx context.Context, dfactory dynamicinformer.DynamicSharedInformerFactory, missing *[]antreaResource) ([]*watchKind, error) {
	served, err := servedAntrea(ctx, w.client)
	if err != nil || served == nil {
		return nil, err
	}
	var added []*watchKind
	var still []antreaResource
	for _, r := range *missing {
		if !served[r.resource] {
			still = append(still, r)
			continue
		}
		k, err := w.antreaKind(dfactory, r)
		if err == nil {
			err = w.register(k)
		}
		if err != nil {
			return added, err
		}
		w.log.InfoContext(ctx, "kubernetes: an Antrea resource is served now; watching it", "resource", k.resource)
		added = append(added, k)
	}
	*missing = still
	if len(added) > 0 {
		w.mu.Lock()
		w.kinds = append(slices.Clip(w.kinds), added...)
		w.probs = missingProblems(still)
		w.mu.Unlock()
		w.signalSync()
	}
	return added, nil
}

func missingProblems(missing []antreaResource) cluster.Problems {
	var probs cluster.Problems
	for _, r := range missing {
		if !r.quiet {
			probs = append(probs, missingCRD(r.resource+"."+antreaGroupVersion.Group, r.kind))
		}
	}
	return probs
}

// antreaKind makes the dynamic informer of one Antrea resource.
func (w *Watcher) antreaKind(dfactory dynamicinformer.DynamicSharedInformerFactory, r antreaResource) (*watchKind, error) {
	name := r.resource + "." + antreaGroupVersion.Group
	inf := dfactory.ForResource(antreaGroupVersion.WithResource(r.resource)).Informer()
	if err := inf.SetTransform(trimAntrea(r.kind)); err != nil {
		return nil, fmt.Errorf("kube watcher: %s informer: %w", name, err)
	}
	return &watchKind{resource: name, apiVersion: antreaGroupVersion.String(), kind: r.kind, quiet: r.quiet, informer: inf}, nil
}

// watchErrorHandler is k's handler of failed lists and watches.
func (w *Watcher) watchErrorHandler(k *watchKind) cache.WatchErrorHandlerWithContext {
	return func(ctx context.Context, _ *cache.Reflector, err error) {
		w.errCount.Add(1)
		k.lastErr.Store(&err)
		if apierrors.IsNotFound(err) && !k.typed {
			w.log.DebugContext(ctx, "kubernetes: resource not served", "resource", k.resource)
		} else {
			w.log.WarnContext(ctx, "kubernetes: list or watch failed; retrying", "resource", k.resource, "err", err)
		}
		w.signal()
		w.signalSync()
	}
}

// register sets k's error and event handlers (the error handler is the
// shared factory's business when k's informer is shared).
func (w *Watcher) register(k *watchKind) error {
	if !k.sharedErrs {
		if err := k.informer.SetWatchErrorHandlerWithContext(w.watchErrorHandler(k)); err != nil {
			return fmt.Errorf("kube watcher: %s informer: %w", k.resource, err)
		}
	}
	reg, err := k.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { w.events.Add(1); w.signal() },
		UpdateFunc: func(old, cur any) {
			if !sameContent(old, cur) {
				w.signal()
			}
			w.events.Add(1) // after: a counted event has been signalled or not
		},
		DeleteFunc: func(any) { w.events.Add(1); w.signal() },
	})
	if err != nil {
		return fmt.Errorf("kube watcher: %s informer: %w", k.resource, err)
	}
	k.reg = reg
	return nil
}

// sameContent reports whether an update changed nothing but the cached
// object's resourceVersion and generation, which Objects leaves out: the
// status churn the trim removed (Pod conditions, Node heartbeats) or a
// resync. Such an update is no change to signal: a consumer that reloads
// at each signal would find the same objects.
func sameContent(old, cur any) bool {
	o, ok1 := old.(runtime.Object)
	c, ok2 := cur.(runtime.Object)
	if !ok1 || !ok2 {
		return false
	}
	mo, err1 := meta.Accessor(o)
	mc, err2 := meta.Accessor(c)
	if err1 != nil || err2 != nil {
		return false
	}
	if mo.GetResourceVersion() != mc.GetResourceVersion() || mo.GetGeneration() != mc.GetGeneration() {
		o = o.DeepCopyObject() // the cache's objects are read-only
		if mo, err1 = meta.Accessor(o); err1 != nil {
			return false
		}
		mo.SetResourceVersion(mc.GetResourceVersion())
		mo.SetGeneration(mc.GetGeneration())
	}
	return equality.Semantic.DeepEqual(o, c)
}

// Objects returns the cached objects, in a fixed order (by resource, then
// namespace and name), each encoded as Load encodes it, without its
// resourceVersion (so that an object's content alone says whether it
// changed). It fails while a resource has not been listed yet, naming the
// resources and, for one whose list failed, why (a forbidden list says
// which permission is missing). A resource that turned out not to be
// served is left out, with a warning.
func (w *Watcher) Objects() ([]cluster.Object, cluster.Problems, error) {
	w.mu.Lock()
	kinds, probs, started := w.kinds, slices.Clone(w.probs), w.started
	w.mu.Unlock()
	if !started {
		return nil, nil, errors.New("the cluster state is not listed yet (the watch has not started)")
	}
	var waiting []string
	var failed []error
	for _, k := range kinds {
		if k.reg.HasSynced() {
			continue
		}
		var last error
		if p := k.lastErr.Load(); p != nil {
			last = *p
		}
		switch {
		case last != nil && !k.typed && apierrors.IsNotFound(last):
			if !k.quiet {
				probs = append(probs, missingCRD(k.resource, k.kind))
			}
		case last != nil && apierrors.IsForbidden(last):
			failed = append(failed, fmt.Errorf("listing %s: %w (Sluice needs get, list and watch on %s)", k.resource, last, k.resource))
		case last != nil:
			failed = append(failed, fmt.Errorf("listing %s: %w", k.resource, last))
		default:
			waiting = append(waiting, k.resource)
		}
	}
	if len(failed) > 0 {
		return nil, probs, errors.Join(failed...)
	}
	if len(waiting) > 0 {
		return nil, probs, fmt.Errorf("the cluster state is not listed yet: waiting for %s", strings.Join(waiting, ", "))
	}
	var out []cluster.Object
	for _, k := range kinds {
		if !k.reg.HasSynced() {
			continue // not served
		}
		objs, err := k.objects()
		if err != nil {
			return nil, probs, fmt.Errorf("listing %s: %w", k.resource, err)
		}
		slices.SortFunc(objs, func(a, b cluster.Object) int {
			if c := strings.Compare(a.Namespace, b.Namespace); c != 0 {
				return c
			}
			return strings.Compare(a.Name, b.Name)
		})
		out = append(out, objs...)
	}
	return out, probs, nil
}

// objects encodes the cached objects, reusing the encoding of those
// whose resourceVersion has not changed since the last call. The Raw
// bytes are shared between calls: nobody writes into them.
func (k *watchKind) objects() ([]cluster.Object, error) {
	items := k.informer.GetStore().List()
	k.encMu.Lock()
	defer k.encMu.Unlock()
	next := make(map[string]encoded, len(items))
	out := make([]cluster.Object, 0, len(items))
	for _, it := range items {
		m, err := meta.Accessor(it)
		if err != nil {
			return nil, fmt.Errorf("unexpected cached value %T: %w", it, err)
		}
		key, rv := m.GetNamespace()+"/"+m.GetName(), m.GetResourceVersion()
		e, ok := k.enc[key]
		if !ok || rv == "" || e.resourceVersion != rv {
			o, err := k.encode(it)
			if err != nil {
				return nil, err
			}
			e = encoded{resourceVersion: rv, obj: o}
		}
		next[key] = e
		out = append(out, e.obj)
	}
	k.enc = next
	return out, nil
}

// encode turns a cached object into a cluster.Object.
func (k *watchKind) encode(it any) (cluster.Object, error) {
	ro, ok := it.(runtime.Object)
	if !ok {
		return cluster.Object{}, fmt.Errorf("unexpected cached value %T", it)
	}
	ro = ro.DeepCopyObject()
	m, err := meta.Accessor(ro)
	if err != nil {
		return cluster.Object{}, fmt.Errorf("unexpected cached value %T: %w", it, err)
	}
	m.SetResourceVersion("")
	m.SetGeneration(0)
	if k.dropIPPools {
		if a := m.GetAnnotations(); a != nil {
			delete(a, crd.AnnotationIPPools)
			if len(a) == 0 {
				m.SetAnnotations(nil)
			}
		}
	}
	var raw []byte
	if u, ok := ro.(*unstructured.Unstructured); ok {
		if u.GetAPIVersion() == "" {
			u.SetAPIVersion(k.apiVersion)
		}
		if u.GetKind() == "" {
			u.SetKind(k.kind)
		}
		if u.GetKind() != k.kind {
			return cluster.Object{}, fmt.Errorf("%s %q has kind %q, want %s", k.resource, u.GetName(), u.GetKind(), k.kind)
		}
		raw, err = u.MarshalJSON()
	} else {
		raw, err = json.Marshal(ro)
		if err == nil {
			raw, err = withTypeMeta(raw, k.apiVersion, k.kind)
		}
	}
	if err != nil {
		return cluster.Object{}, fmt.Errorf("encoding %s: %w", describe(k.kind, m.GetNamespace(), m.GetName()), err)
	}
	return cluster.Object{APIVersion: k.apiVersion, Kind: k.kind, Namespace: m.GetNamespace(), Name: m.GetName(),
		Source: "live " + k.resource, Raw: raw}, nil
}

// Stats returns the counters.
func (w *Watcher) Stats() WatchStats {
	w.mu.Lock()
	kinds := w.kinds
	w.mu.Unlock()
	s := WatchStats{Events: w.events.Load(), WatchErrors: w.errCount.Load(), Synced: len(kinds) > 0}
	for _, k := range kinds {
		s.Objects += len(k.informer.GetStore().ListKeys())
		if !k.reg.HasSynced() {
			s.Synced = false
		}
	}
	return s
}

// trimTyped is the typed informers' transform: it keeps what
// cluster.Build reads, the ipam.antrea.io/ippools annotation of Pods and
// Namespaces only with ippools. Idempotent; other values (tombstones)
// pass.
func trimTyped(ippools bool) cache.TransformFunc {
	trim := func(m *metav1.ObjectMeta) metav1.ObjectMeta {
		t := kubetrim.Trim(m)
		if v, ok := m.Annotations[crd.AnnotationIPPools]; ok && ippools {
			t.Annotations = map[string]string{crd.AnnotationIPPools: v}
		}
		return t
	}
	return func(obj any) (any, error) {
		switch o := obj.(type) {
		case *corev1.Pod:
			return &corev1.Pod{
				ObjectMeta: trim(&o.ObjectMeta),
				Spec: corev1.PodSpec{NodeName: o.Spec.NodeName, HostNetwork: o.Spec.HostNetwork,
					Containers: kubetrim.NamedPorts(o.Spec.Containers)},
				Status: corev1.PodStatus{Phase: o.Status.Phase, PodIP: o.Status.PodIP, PodIPs: o.Status.PodIPs},
			}, nil
		case *corev1.Node:
			return kubetrim.Node(o), nil
		case *corev1.Namespace:
			return &corev1.Namespace{ObjectMeta: trim(&o.ObjectMeta)}, nil
		case *corev1.Service:
			return &corev1.Service{ObjectMeta: kubetrim.Trim(&o.ObjectMeta), Spec: o.Spec,
				Status: corev1.ServiceStatus{LoadBalancer: o.Status.LoadBalancer}}, nil
		case *discoveryv1.EndpointSlice:
			c := *o
			c.ObjectMeta = kubetrim.Trim(&o.ObjectMeta)
			return &c, nil
		case *networkingv1.NetworkPolicy:
			return &networkingv1.NetworkPolicy{ObjectMeta: kubetrim.Trim(&o.ObjectMeta), Spec: o.Spec}, nil
		}
		return obj, nil
	}
}

// trimAntrea is the dynamic informers' transform: managed fields and
// annotations go, and the status of policies and groups (realization
// counts the model does not read); an Egress keeps its status (the IP and
// the Node that holds it).
func trimAntrea(kind string) cache.TransformFunc {
	return func(obj any) (any, error) {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			return obj, nil
		}
		u.SetManagedFields(nil)
		u.SetAnnotations(nil)
		if kind != crd.KindEgress {
			unstructured.RemoveNestedField(u.Object, "status")
		}
		return u, nil
	}
}
