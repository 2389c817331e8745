// Package kubeinformers is a process's one informer factory: the
// aggregator's Pod metadata cache (enrich) and its Traceflow watch
// (traceflow/cluster/kube), or the exporter's Pod metadata and policy
// attribution, read the cluster through one set of lists and watches and
// one cache per resource, trimmed to what either reads (kubetrim.Object).
//
// Each user takes its informers through Informer, adds its event handlers,
// and calls Start; informers already started are left running. An
// informer has one watch-error handler: Shared installs its own on each
// informer it hands out, before anyone can start it, and passes each error
// on to every user's.
package kubeinformers

import (
	"context"
	"fmt"
	"sync"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"sluice/kubetrim"
)

// Shared is the informer factory a process's users share.
type Shared struct {
	client  kubernetes.Interface
	factory informers.SharedInformerFactory

	mu sync.Mutex
	// byResource: the factory's accessors wrap its informer anew at each
	// call (typed informers), so the first one handed out is kept.
	byResource map[string]*shared
}

// shared is one resource's informer and its users' error handlers.
type shared struct {
	inf cache.SharedIndexInformer
	fo  *fanout
}

// New returns a Shared reading the cluster through client; nothing is
// listed until Start.
func New(client kubernetes.Interface) *Shared {
	return &Shared{
		client:     client,
		factory:    informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTransform(kubetrim.Object)),
		byResource: map[string]*shared{},
	}
}

// Client is the client the informers list and watch through.
func (s *Shared) Client() kubernetes.Interface { return s.client }

// Informer returns the informer of resource ("pods", "nodes"…) that get
// makes of the factory (one per resource, whoever asks: get is called for
// the first), with onErr added to the handlers of its failed lists and
// watches (nil: none).
func (s *Shared) Informer(resource string, get func(informers.SharedInformerFactory) cache.SharedIndexInformer,
	onErr cache.WatchErrorHandlerWithContext) (cache.SharedIndexInformer, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sh := s.byResource[resource]
	if sh == nil {
		sh = &shared{inf: get(s.factory), fo: &fanout{}}
		if err := sh.inf.SetWatchErrorHandlerWithContext(sh.fo.handle); err != nil {
			// Started by someone who did not ask through Shared.
			return nil, fmt.Errorf("kubeinformers: %s: %w", resource, err)
		}
		s.byResource[resource] = sh
	}
	if onErr != nil {
		sh.fo.add(onErr)
	}
	return sh.inf, nil
}

// Informers is how many informers (resources) were handed out: what the
// process lists and watches.
func (s *Shared) Informers() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byResource)
}

// Start starts the informers not started yet; they run until ctx ends.
// It holds the lock Informer holds, so that it never starts an informer
// Informer has made but not yet given its watch-error fan-out (which an
// informer refuses once started).
func (s *Shared) Start(ctx context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.factory.StartWithContext(ctx)
}

// Shutdown waits for the started informers to stop (after the contexts
// they were started with ended).
func (s *Shared) Shutdown() { s.factory.Shutdown() }

// fanout passes an informer's watch errors to each user's handler; with
// none, to client-go's default (which logs).
type fanout struct {
	mu sync.Mutex
	hs []cache.WatchErrorHandlerWithContext
}

func (f *fanout) add(h cache.WatchErrorHandlerWithContext) {
	f.mu.Lock()
	f.hs = append(f.hs, h)
	f.mu.Unlock()
}

func (f *fanout) handle(ctx context.Context, r *cache.Reflector, err error) {
	f.mu.Lock()
	hs := f.hs
	f.mu.Unlock()
	if len(hs) == 0 {
		cache.DefaultWatchErrorHandler(ctx, r, err)
		return
	}
	for _, h := range hs {
		h(ctx, r, err)
	}
}
