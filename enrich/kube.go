package enrich

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"sluice/kubeinformers"
	"sluice/kubetrim"
)

const (
	// DefaultKubeSyncTimeout is how long Run waits for the initial lists of
	// Pods, Nodes and Services before it reports the Kube ready anyway.
	DefaultKubeSyncTimeout = 30 * time.Second
	// DefaultKubeBatchInterval is the shortest time between two snapshot
	// rebuilds caused by events.
	DefaultKubeBatchInterval = 100 * time.Millisecond

	// kubeExpireInterval is how often Run forgets deleted objects whose
	// retention has passed when no event comes in.
	kubeExpireInterval = time.Second
)

// KubeOptions configures a Kube. The zero value gives the defaults; zero or
// negative durations mean the default.
type KubeOptions struct {
	// Retention is how long deleted Pods, Nodes and Services are remembered;
	// DefaultRetention if zero.
	Retention time.Duration
	// SyncTimeout bounds the wait for the initial lists; see Run.
	// DefaultKubeSyncTimeout if zero.
	SyncTimeout time.Duration
	// BatchInterval is the shortest time between two snapshot rebuilds:
	// events arriving meanwhile are applied together.
	// DefaultKubeBatchInterval if zero.
	BatchInterval time.Duration
	// Now is the clock used to stamp deletions and expire them; time.Now if
	// nil.
	Now func() time.Time
	// Logger receives sync and watch events, client-go's own messages
	// included; slog.Default() if nil.
	Logger *slog.Logger
	// Informers, when set, is the process's informer factory, which the
	// Kube then shares (see package kubeinformers) instead of running its
	// own. Its owner shuts it down.
	Informers *kubeinformers.Shared
}

// Kube is a Store that follows a Kubernetes cluster through the API server:
// informers watch the Pods, Nodes and Services of all namespaces, and every
// change is applied as it is reported. Look-ups behave as with [Inventory]:
// deleted objects are remembered for the retention time, and a Pod IP that
// a new Pod reuses resolves by the flow's start time. Deletion times are the
// times the deletions were reported, not those of a later file dump.
//
// Pods that use the host network are not indexed: their IP is the Node's.
//
// The objects kept by the informers are trimmed to the fields Sluice reads
// (see the transform in this file), so that a large cluster costs little
// memory. Events are applied in batches, at most one snapshot rebuild per
// BatchInterval; the initial lists are applied in a single rebuild.
//
// It needs get, list and watch on pods, nodes and services at cluster scope.
type Kube struct {
	client        kubernetes.Interface
	shared        *kubeinformers.Shared
	syncTimeout   time.Duration
	batchInterval time.Duration
	now           func() time.Time
	log           *slog.Logger
	t             *tracker

	running   atomic.Bool
	synced    atomic.Bool
	ready     chan struct{} // closed when synced or when the sync timeout passed
	readyOnce sync.Once
	wake      chan struct{} // capacity 1: events are pending

	mu      sync.Mutex // guards pending
	pending []kubeEvent
	flushMu sync.Mutex // serialises flushes so that batches apply in order

	// Counters for Stats.
	syncDuration                  atomic.Int64 // nanoseconds from Run to sync
	events, unchanged, tombstones atomic.Uint64
	watchErrors, invalidAddrs     atomic.Uint64
	rebuilds                      atomic.Uint64
	lastRebuild                   atomic.Int64 // Unix nanoseconds by the Now clock; 0 if none
	lastWatchError                atomic.Pointer[string]
	hostNetworkPods               atomic.Int64
}

var _ Store = (*Kube)(nil)

// KubeStats describes a Kube's events and current data.
type KubeStats struct {
	// Synced reports whether the initial lists have been applied.
	Synced bool
	// SyncDuration is how long the initial lists took, from the start of
	// Run; zero until Synced.
	SyncDuration time.Duration
	// Events counts the add, update and delete notifications received;
	// Unchanged counts the updates among them that changed nothing Sluice
	// reads (Pod status conditions, say) and were dropped.
	Events, Unchanged uint64
	// Tombstones counts deletions that the informers inferred after a watch
	// gap (cache.DeletedFinalStateUnknown).
	Tombstones uint64
	// Rebuilds counts the snapshot rebuilds caused by events, and
	// LastRebuild is the time of the last one (by the Now clock).
	Rebuilds    uint64
	LastRebuild time.Time
	// WatchErrors counts failed lists and dropped watches (the informers
	// retry them); LastWatchError is the latest one, "" if none.
	WatchErrors    uint64
	LastWatchError string
	// InvalidAddresses counts addresses and CIDRs that did not parse; they
	// were left out.
	InvalidAddresses uint64
	// Current data: live Pods, deleted Pods still remembered, Nodes and
	// Services (deleted ones still remembered included).
	Pods, DeletedPods, Nodes, Services int
	// HostNetworkPods is the number of live Pods left out because they use
	// the host network.
	HostNetworkPods int
}

// KubeConfig returns the client configuration to reach the API server: the
// current context of the kubeconfig file at kubeconfigPath, or, when the
// path is empty, the in-cluster configuration (the service account of the
// Pod Sluice runs in). The returned configuration asks for protobuf, which
// the API server encodes and Sluice decodes faster than JSON.
func KubeConfig(kubeconfigPath string) (*rest.Config, error) {
	var cfg *rest.Config
	if kubeconfigPath != "" {
		var err error
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfigPath)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfigPath, err)
		}
	} else {
		var err error
		cfg, err = rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("no kubeconfig given and no in-cluster configuration "+
				"(%w): set sluice.kubeconfig, or run Sluice in a Pod with a service account", err)
		}
	}
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	if cfg.UserAgent == "" {
		cfg.UserAgent = "sluice"
	}
	return cfg, nil
}

// Client is the client the Kube reads the cluster through.
func (k *Kube) Client() kubernetes.Interface { return k.client }

// Informers is the informer factory the Kube shares (KubeOptions.Informers),
// nil when it runs its own.
func (k *Kube) Informers() *kubeinformers.Shared { return k.shared }

// NewKube returns a Kube that reads the cluster through client. It holds
// no data until Run has synced.
func NewKube(client kubernetes.Interface, opts KubeOptions) *Kube {
	k := &Kube{
		client:        client,
		shared:        opts.Informers,
		syncTimeout:   opts.SyncTimeout,
		batchInterval: opts.BatchInterval,
		now:           opts.Now,
		log:           opts.Logger,
		ready:         make(chan struct{}),
		wake:          make(chan struct{}, 1),
	}
	if k.syncTimeout <= 0 {
		k.syncTimeout = DefaultKubeSyncTimeout
	}
	if k.batchInterval <= 0 {
		k.batchInterval = DefaultKubeBatchInterval
	}
	if k.now == nil {
		k.now = time.Now
	}
	if k.log == nil {
		k.log = slog.Default()
	}
	retention := opts.Retention
	if retention <= 0 {
		retention = DefaultRetention
	}
	k.t = newTracker(retention)
	return k
}

// Run starts informers for the Pods, Nodes and Services of all namespaces,
// applies their events until ctx is done, then stops them and returns nil.
// It may be called once.
//
// Run waits up to SyncTimeout for the initial lists. If they are not
// complete by then, it logs an error and goes on: look-ups use whatever has
// been applied, and the lists are applied when they complete (HasSynced
// then turns true). Ready is closed in either case. Failed lists and
// watches are logged and retried by the informers, never returned.
func (k *Kube) Run(ctx context.Context) error {
	if !k.running.CompareAndSwap(false, true) {
		return errors.New("kube: Run called more than once")
	}
	start := time.Now()
	defer k.markReady()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// client-go logs through the logger in the context: send it to slog.
	ictx := klog.NewContext(ctx, logr.FromSlogHandler(k.log.Handler()))

	// Our own factory, or the process's shared one (whose transform keeps
	// what trimObject keeps, and more).
	var factory informers.SharedInformerFactory
	if k.shared == nil {
		factory = informers.NewSharedInformerFactoryWithOptions(k.client, 0, informers.WithTransform(trimObject))
	}
	informer := func(resource string, get func(informers.SharedInformerFactory) cache.SharedIndexInformer) (cache.SharedIndexInformer, error) {
		if k.shared != nil {
			return k.shared.Informer(resource, get, k.onWatchError)
		}
		inf := get(factory)
		return inf, inf.SetWatchErrorHandlerWithContext(k.onWatchError)
	}
	kinds := []struct {
		name    string
		get     func(informers.SharedInformerFactory) cache.SharedIndexInformer
		handler cache.ResourceEventHandler
	}{
		{"pods", func(f informers.SharedInformerFactory) cache.SharedIndexInformer {
			return f.Core().V1().Pods().Informer()
		},
			cache.ResourceEventHandlerDetailedFuncs{AddFunc: k.onPodAdd, UpdateFunc: k.onPodUpdate, DeleteFunc: k.onPodDelete}},
		{"nodes", func(f informers.SharedInformerFactory) cache.SharedIndexInformer {
			return f.Core().V1().Nodes().Informer()
		},
			cache.ResourceEventHandlerDetailedFuncs{AddFunc: k.onNodeAdd, UpdateFunc: k.onNodeUpdate, DeleteFunc: k.onNodeDelete}},
		{"services", func(f informers.SharedInformerFactory) cache.SharedIndexInformer {
			return f.Core().V1().Services().Informer()
		},
			cache.ResourceEventHandlerDetailedFuncs{AddFunc: k.onServiceAdd, UpdateFunc: k.onServiceUpdate, DeleteFunc: k.onServiceDelete}},
	}
	regs := make([]kubeRegistration, 0, len(kinds))
	for _, kind := range kinds {
		inf, err := informer(kind.name, kind.get)
		if err != nil {
			return fmt.Errorf("kube: %s informer: %w", kind.name, err)
		}
		reg, err := inf.AddEventHandler(kind.handler)
		if err != nil {
			return fmt.Errorf("kube: %s informer: %w", kind.name, err)
		}
		regs = append(regs, kubeRegistration{kind.name, reg})
	}

	k.log.InfoContext(ctx, "kubernetes: watching pods, nodes and services", "syncTimeout", k.syncTimeout)
	if k.shared != nil {
		k.shared.Start(ictx)
	} else {
		factory.StartWithContext(ictx)
	}
	var wg sync.WaitGroup
	wg.Go(func() { k.applyLoop(ctx) })
	k.waitForSync(ctx, regs, start)
	<-ctx.Done()
	wg.Wait()
	if factory != nil {
		factory.Shutdown() // the informers stop with ctx; wait for them
	}
	return nil
}

// Ready returns a channel that is closed once the initial lists have been
// applied or SyncTimeout has passed since Run started, whichever comes
// first (or when Run returns): the point where a caller that waits for
// Kubernetes metadata before serving should stop waiting.
func (k *Kube) Ready() <-chan struct{} { return k.ready }

// HasSynced reports whether the initial lists of Pods, Nodes and Services
// have been applied.
func (k *Kube) HasSynced() bool { return k.synced.Load() }

// Stats returns the event counters and the size of the current data.
func (k *Kube) Stats() KubeStats {
	s := k.t.snapshot()
	st := KubeStats{
		Synced:           k.synced.Load(),
		SyncDuration:     time.Duration(k.syncDuration.Load()),
		Events:           k.events.Load(),
		Unchanged:        k.unchanged.Load(),
		Tombstones:       k.tombstones.Load(),
		Rebuilds:         k.rebuilds.Load(),
		WatchErrors:      k.watchErrors.Load(),
		InvalidAddresses: k.invalidAddrs.Load(),
		Pods:             s.livePods,
		DeletedPods:      s.deletedPods,
		Nodes:            len(s.nodes),
		Services:         len(s.services),
		HostNetworkPods:  int(k.hostNetworkPods.Load()),
	}
	if ns := k.lastRebuild.Load(); ns != 0 {
		st.LastRebuild = time.Unix(0, ns)
	}
	if msg := k.lastWatchError.Load(); msg != nil {
		st.LastWatchError = *msg
	}
	return st
}

// PodByIP implements Store.
func (k *Kube) PodByIP(ip netip.Addr, at time.Time) (*Pod, bool) {
	return k.t.snapshot().podByIP(ip, at)
}

// NodeByName implements Store.
func (k *Kube) NodeByName(name string) (*Node, bool) {
	return k.t.snapshot().nodeByName(name)
}

// ServiceByName implements Store.
func (k *Kube) ServiceByName(namespace, name string) (*Service, bool) {
	return k.t.snapshot().serviceByName(namespace, name)
}

// ServiceByClusterIP implements Store.
func (k *Kube) ServiceByClusterIP(ip netip.Addr) (*Service, bool) {
	return k.t.snapshot().serviceByClusterIP(ip)
}

type kubeRegistration struct {
	kind string
	reg  cache.ResourceEventHandlerRegistration
}

// waitForSync waits until every handler has received its informer's initial
// list, then applies all pending events in one rebuild and marks the Kube
// synced. Past the sync timeout it logs an error, closes Ready and keeps
// waiting.
func (k *Kube) waitForSync(ctx context.Context, regs []kubeRegistration, start time.Time) {
	timeout := time.NewTimer(k.syncTimeout)
	defer timeout.Stop()
	late := false
	for i, r := range regs {
		done := r.reg.HasSyncedChecker().Done()
		for waiting := true; waiting; {
			select {
			case <-done:
				waiting = false
			case <-ctx.Done():
				return
			case <-timeout.C:
				var missing []string
				for _, r := range regs[i:] {
					if !r.reg.HasSynced() {
						missing = append(missing, r.kind)
					}
				}
				k.log.ErrorContext(ctx, "kubernetes: initial lists not complete, going on without them",
					"timeout", k.syncTimeout, "missing", strings.Join(missing, ","),
					"lastError", k.Stats().LastWatchError)
				late = true
				k.markReady()
			}
		}
	}
	k.flush()
	d := time.Since(start)
	k.syncDuration.Store(int64(d))
	k.synced.Store(true)
	k.markReady()
	st := k.Stats()
	k.log.InfoContext(ctx, "kubernetes: caches synced", "duration", d.Round(time.Millisecond), "late", late,
		"pods", st.Pods, "hostNetworkPods", st.HostNetworkPods, "nodes", st.Nodes, "services", st.Services)
}

func (k *Kube) markReady() { k.readyOnce.Do(func() { close(k.ready) }) }

// applyLoop applies pending events once Ready is closed: the first event
// after a quiet period at once, then at most one batch per batchInterval.
// Before Ready the events wait, so that the initial lists cost one rebuild
// (made by waitForSync). It also forgets expired deleted objects.
func (k *Kube) applyLoop(ctx context.Context) {
	select {
	case <-ctx.Done():
		return
	case <-k.ready:
	}
	expire := time.NewTicker(kubeExpireInterval)
	defer expire.Stop()
	pause := time.NewTimer(0)
	defer pause.Stop()
	<-pause.C
	for {
		select {
		case <-ctx.Done():
			return
		case <-expire.C:
			k.t.expire(k.now())
			continue
		case <-k.wake:
		}
		k.flush()
		pause.Reset(k.batchInterval)
		select {
		case <-ctx.Done():
			return
		case <-pause.C:
		}
	}
}

// flush applies the pending events in one tracker update.
func (k *Kube) flush() {
	k.flushMu.Lock()
	defer k.flushMu.Unlock()
	k.mu.Lock()
	batch := k.pending
	k.pending = nil
	k.mu.Unlock()
	if len(batch) == 0 {
		return
	}
	now := k.now()
	k.t.update(now, func(tx *txn) {
		for i := range batch {
			batch[i].apply(tx)
		}
	})
	k.rebuilds.Add(1)
	k.lastRebuild.Store(now.UnixNano())
}

func (k *Kube) enqueue(ev kubeEvent) {
	k.mu.Lock()
	k.pending = append(k.pending, ev)
	k.mu.Unlock()
	select {
	case k.wake <- struct{}{}:
	default:
	}
}

func (k *Kube) onWatchError(ctx context.Context, r *cache.Reflector, err error) {
	k.watchErrors.Add(1)
	msg := err.Error()
	k.lastWatchError.Store(&msg)
	cache.DefaultWatchErrorHandler(ctx, r, err)
}

type kubeOp uint8

const (
	opSetPod kubeOp = iota
	opDeletePod
	opDeletePodNamed
	opSetNode
	opDeleteNode
	opSetService
	opDeleteService
)

// kubeEvent is one change, recorded by an informer handler and applied by
// flush.
type kubeEvent struct {
	op      kubeOp
	at      time.Time // when the event was received: the deletion time
	pod     *Pod
	node    *Node
	service *Service
	// The object deleted: a Pod UID, a Node name, or a namespace and name.
	uid, namespace, name string
}

func (ev *kubeEvent) apply(tx *txn) {
	// Stamp deletions with the time the event came in, not the (later) time
	// of the batch.
	etx := &txn{t: tx.t, now: ev.at}
	switch ev.op {
	case opSetPod:
		etx.setPod(ev.pod)
	case opDeletePod:
		etx.deletePod(ev.uid)
	case opDeletePodNamed:
		// The informer lost the object: find the live Pod by name.
		for key, p := range tx.t.pods {
			if p.Deleted.IsZero() && p.Namespace == ev.namespace && p.Name == ev.name {
				etx.deletePod(key)
			}
		}
	case opSetNode:
		etx.setNode(ev.node)
	case opDeleteNode:
		etx.deleteNode(ev.name)
	case opSetService:
		etx.setService(ev.service)
	case opDeleteService:
		etx.deleteService(ev.namespace, ev.name)
	}
}

// Informer handlers. They run on the informers' goroutines: they convert
// the object and queue the change.

func (k *Kube) onPodAdd(obj any, isInInitialList bool) {
	k.events.Add(1)
	if p, ok := obj.(*corev1.Pod); ok {
		k.podSet(p)
	}
}

// podSet records a Pod added or changed (host-network Pods are counted,
// not indexed).
func (k *Kube) podSet(p *corev1.Pod) {
	if p.Spec.HostNetwork {
		k.hostNetworkPods.Add(1)
		return
	}
	k.enqueue(kubeEvent{op: opSetPod, at: k.now(), pod: k.convertPod(p)})
}

func (k *Kube) onPodUpdate(oldObj, newObj any) {
	k.events.Add(1)
	old, _ := oldObj.(*corev1.Pod)
	p, ok := newObj.(*corev1.Pod)
	if !ok {
		return
	}
	if old != nil && old.UID != p.UID {
		// Deleted and created again under the same name during a watch
		// gap: the relist reports it as an update, one event.
		k.podDeleted(old, old.Namespace, old.Name)
		k.podSet(p)
		return
	}
	if old != nil && samePod(old, p) {
		k.unchanged.Add(1)
		return
	}
	if old != nil && old.Spec.HostNetwork != p.Spec.HostNetwork {
		// Not expected (the field is immutable), but keep the count right.
		if p.Spec.HostNetwork {
			k.hostNetworkPods.Add(1)
			k.enqueue(kubeEvent{op: opDeletePod, at: k.now(), uid: string(p.UID)})
			return
		}
		k.hostNetworkPods.Add(-1)
	}
	if p.Spec.HostNetwork {
		return
	}
	k.enqueue(kubeEvent{op: opSetPod, at: k.now(), pod: k.convertPod(p)})
}

func (k *Kube) onPodDelete(obj any) {
	k.events.Add(1)
	if p, ns, name, ok := deleted[*corev1.Pod](k, obj, "Pod"); ok {
		k.podDeleted(p, ns, name)
	}
}

// podDeleted records the deletion of Pod p, or, when only a tombstone's
// key is known (p nil or without a UID), of the Pod named ns/name.
func (k *Kube) podDeleted(p *corev1.Pod, ns, name string) {
	switch {
	case p != nil && p.Spec.HostNetwork:
		k.hostNetworkPods.Add(-1)
	case p == nil || p.UID == "":
		k.enqueue(kubeEvent{op: opDeletePodNamed, at: k.now(), namespace: ns, name: name})
	default:
		k.enqueue(kubeEvent{op: opDeletePod, at: k.now(), uid: string(p.UID)})
	}
}

func (k *Kube) onNodeAdd(obj any, isInInitialList bool) {
	k.events.Add(1)
	if n, ok := obj.(*corev1.Node); ok {
		k.enqueue(kubeEvent{op: opSetNode, at: k.now(), node: k.convertNode(n)})
	}
}

func (k *Kube) onNodeUpdate(oldObj, newObj any) {
	k.events.Add(1)
	n, ok := newObj.(*corev1.Node)
	if !ok {
		return
	}
	node := k.convertNode(n)
	if old, ok := oldObj.(*corev1.Node); ok && sameNode(convertNode(old, nil), node) {
		k.unchanged.Add(1)
		return
	}
	k.enqueue(kubeEvent{op: opSetNode, at: k.now(), node: node})
}

func (k *Kube) onNodeDelete(obj any) {
	k.events.Add(1)
	if _, _, name, ok := deleted[*corev1.Node](k, obj, "Node"); ok {
		k.enqueue(kubeEvent{op: opDeleteNode, at: k.now(), name: name})
	}
}

func (k *Kube) onServiceAdd(obj any, isInInitialList bool) {
	k.events.Add(1)
	if s, ok := obj.(*corev1.Service); ok {
		k.enqueue(kubeEvent{op: opSetService, at: k.now(), service: k.convertService(s)})
	}
}

func (k *Kube) onServiceUpdate(oldObj, newObj any) {
	k.events.Add(1)
	s, ok := newObj.(*corev1.Service)
	if !ok {
		return
	}
	svc := k.convertService(s)
	if old, ok := oldObj.(*corev1.Service); ok && sameService(convertService(old, nil), svc) {
		k.unchanged.Add(1)
		return
	}
	k.enqueue(kubeEvent{op: opSetService, at: k.now(), service: svc})
}

func (k *Kube) onServiceDelete(obj any) {
	k.events.Add(1)
	if _, ns, name, ok := deleted[*corev1.Service](k, obj, "Service"); ok {
		k.enqueue(kubeEvent{op: opDeleteService, at: k.now(), namespace: ns, name: name})
	}
}

// deleted reads a delete notification, the one way for every kind: the
// object and its namespace and name; for a tombstone (a deletion the
// informer inferred from a relist), counted, its last known object, or,
// when it has none, a nil o and the namespace and name of its key. ok is
// false when nothing usable came (a key that does not parse is logged).
func deleted[T interface {
	*corev1.Pod | *corev1.Node | *corev1.Service
	metav1.Object
}](k *Kube, obj any, kind string) (o T, ns, name string, ok bool) {
	if tomb, isTomb := obj.(cache.DeletedFinalStateUnknown); isTomb {
		k.tombstones.Add(1)
		if o, ok := tomb.Obj.(T); ok && o != nil {
			return o, o.GetNamespace(), o.GetName(), true
		}
		ns, name, err := cache.SplitMetaNamespaceKey(tomb.Key)
		if err != nil {
			k.log.Warn("kubernetes: unusable "+kind+" tombstone", "key", tomb.Key, "error", err)
			return nil, "", "", false
		}
		return nil, ns, name, true
	}
	if o, ok := obj.(T); ok && o != nil {
		return o, o.GetNamespace(), o.GetName(), true
	}
	return nil, "", "", false
}

// Conversion from the API types. Addresses that do not parse are left out
// and counted.

func (k *Kube) convertPod(p *corev1.Pod) *Pod { return convertPod(p, &k.invalidAddrs) }

func (k *Kube) convertNode(n *corev1.Node) *Node { return convertNode(n, &k.invalidAddrs) }

func (k *Kube) convertService(s *corev1.Service) *Service {
	return convertService(s, &k.invalidAddrs)
}

// convertPod reads a Pod as parseInventory does; invalid counts addresses
// left out (if not nil).
func convertPod(p *corev1.Pod, invalid *atomic.Uint64) *Pod {
	var ips []netip.Addr
	for _, a := range p.Status.PodIPs {
		ips = appendAddr(ips, a.IP, invalid)
	}
	if len(ips) == 0 {
		ips = appendAddr(ips, p.Status.PodIP, invalid)
	}
	var wl Workload
	if c := metav1.GetControllerOfNoCopy(p); c != nil {
		wl = workloadOf(c.Kind, c.Name, p.Labels)
	}
	return normalizePod(Pod{
		Namespace: p.Namespace,
		Name:      p.Name,
		UID:       string(p.UID),
		NodeName:  p.Spec.NodeName,
		Labels:    p.Labels,
		IPs:       ips,
		Created:   p.CreationTimestamp.Time,
		Finished:  podFinished(string(p.Status.Phase)),
		Deleted:   finishedAt(p),
		Workload:  wl,
	})
}

func convertNode(n *corev1.Node, invalid *atomic.Uint64) *Node {
	node := Node{Name: n.Name, UID: string(n.UID)}
	for _, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP {
			continue
		}
		if ips := appendAddr(nil, a.Address, invalid); len(ips) > 0 {
			node.InternalIP = ips[0]
			break
		}
	}
	cidrs := n.Spec.PodCIDRs
	if len(cidrs) == 0 && n.Spec.PodCIDR != "" {
		cidrs = []string{n.Spec.PodCIDR}
	}
	for _, s := range cidrs {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			countInvalid(invalid)
			continue
		}
		node.PodCIDRs = append(node.PodCIDRs, p)
	}
	return normalizeNode(node)
}

func convertService(s *corev1.Service, invalid *atomic.Uint64) *Service {
	svc := Service{Namespace: s.Namespace, Name: s.Name, UID: string(s.UID)}
	ips := s.Spec.ClusterIPs
	if len(ips) == 0 && s.Spec.ClusterIP != "" {
		ips = []string{s.Spec.ClusterIP}
	}
	for _, a := range ips {
		if a != corev1.ClusterIPNone {
			svc.ClusterIPs = appendAddr(svc.ClusterIPs, a, invalid)
		}
	}
	for _, p := range s.Spec.Ports {
		proto := ProtocolNumber(string(p.Protocol))
		if proto == 0 || p.Port < 1 || p.Port > 65535 {
			countInvalid(invalid)
			continue
		}
		svc.Ports = append(svc.Ports, ServicePort{Name: p.Name, Protocol: proto, Port: uint16(p.Port)})
	}
	return normalizeService(svc)
}

func appendAddr(ips []netip.Addr, s string, invalid *atomic.Uint64) []netip.Addr {
	if s == "" {
		return ips
	}
	ip, err := netip.ParseAddr(s)
	if err != nil {
		countInvalid(invalid)
		return ips
	}
	return append(ips, ip)
}

// podFinished reports whether a Pod in phase has run to completion, which
// releases its address.
func podFinished(phase string) bool {
	return phase == string(corev1.PodSucceeded) || phase == string(corev1.PodFailed)
}

// finishedAt is when a finished Pod's last container ended, zero for a
// Pod that has not finished or whose containers say nothing.
func finishedAt(p *corev1.Pod) time.Time {
	if !podFinished(string(p.Status.Phase)) {
		return time.Time{}
	}
	var last time.Time
	for i := range p.Status.ContainerStatuses {
		if t := p.Status.ContainerStatuses[i].State.Terminated; t != nil && t.FinishedAt.Time.After(last) {
			last = t.FinishedAt.Time
		}
	}
	return last
}

func countInvalid(invalid *atomic.Uint64) {
	if invalid != nil {
		invalid.Add(1)
	}
}

// samePod reports whether two versions of a Pod agree on everything that
// Sluice reads, so that the update can be dropped.
func samePod(a, b *corev1.Pod) bool {
	return a.UID == b.UID && a.Namespace == b.Namespace && a.Name == b.Name &&
		a.Spec.NodeName == b.Spec.NodeName && a.Spec.HostNetwork == b.Spec.HostNetwork &&
		a.CreationTimestamp.Equal(&b.CreationTimestamp) &&
		a.Status.PodIP == b.Status.PodIP &&
		podFinished(string(a.Status.Phase)) == podFinished(string(b.Status.Phase)) && finishedAt(a).Equal(finishedAt(b)) &&
		slices.Equal(a.Status.PodIPs, b.Status.PodIPs) &&
		maps.Equal(a.Labels, b.Labels) &&
		slices.EqualFunc(a.OwnerReferences, b.OwnerReferences, sameOwner)
}

// sameOwner compares owner references by value: their booleans are
// pointers, which differ between two decodings of the same Pod.
func sameOwner(a, b metav1.OwnerReference) bool {
	return a.APIVersion == b.APIVersion && a.Kind == b.Kind && a.Name == b.Name && a.UID == b.UID &&
		sameBool(a.Controller, b.Controller) && sameBool(a.BlockOwnerDeletion, b.BlockOwnerDeletion)
}

func sameBool(a, b *bool) bool {
	return a == b || a != nil && b != nil && *a == *b
}

func sameNode(a, b *Node) bool {
	return a.Name == b.Name && a.UID == b.UID && a.InternalIP == b.InternalIP &&
		slices.Equal(a.PodCIDRs, b.PodCIDRs)
}

func sameService(a, b *Service) bool {
	return a.Namespace == b.Namespace && a.Name == b.Name && a.UID == b.UID &&
		slices.Equal(a.ClusterIPs, b.ClusterIPs) && slices.Equal(a.Ports, b.Ports)
}

// trimObject is the informers' transform: it keeps only the fields that
// Sluice reads, so that the informers' caches of a large cluster stay small
// (managed fields, annotations, container specs and statuses are most of a
// Pod's size). It is idempotent, and leaves other values (tombstones, which
// hold already trimmed objects) as they are.
func trimObject(obj any) (any, error) {
	switch o := obj.(type) {
	case *corev1.Pod:
		m := kubetrim.Trim(&o.ObjectMeta)
		// The controller names the Pod's workload (for the web UI).
		if c := metav1.GetControllerOfNoCopy(o); c != nil {
			m.OwnerReferences = []metav1.OwnerReference{{APIVersion: c.APIVersion, Kind: c.Kind, Name: c.Name,
				UID: c.UID, Controller: c.Controller}}
		}
		t := &corev1.Pod{
			ObjectMeta: m,
			Spec:       corev1.PodSpec{NodeName: o.Spec.NodeName, HostNetwork: o.Spec.HostNetwork},
			Status:     corev1.PodStatus{Phase: o.Status.Phase, PodIP: o.Status.PodIP, PodIPs: o.Status.PodIPs},
		}
		// Of a finished Pod, when it finished: one container status.
		if end := finishedAt(o); !end.IsZero() {
			t.Status.ContainerStatuses = []corev1.ContainerStatus{{State: corev1.ContainerState{
				Terminated: &corev1.ContainerStateTerminated{FinishedAt: metav1.NewTime(end)}}}}
		}
		return t, nil
	case *corev1.Node:
		return kubetrim.Node(o), nil
	case *corev1.Service:
		return &corev1.Service{
			ObjectMeta: kubetrim.Trim(&o.ObjectMeta),
			Spec:       corev1.ServiceSpec{ClusterIP: o.Spec.ClusterIP, ClusterIPs: o.Spec.ClusterIPs, Ports: o.Spec.Ports},
		}, nil
	}
	return obj, nil
}
