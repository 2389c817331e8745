package kubeinformers_test

import (
	"context"
	"runtime"
	"testing"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"

	"sluice/kubeinformers"
)

// TestStartDuringInformer: one user's Start may run while another user's
// Informer is making its informer (the aggregator's metadata source starts
// the factory while its Traceflow watch asks for Namespaces). Start must
// not start an informer before Informer has installed its watch-error
// fan-out, or Informer fails with "informer has already started".
func TestStartDuringInformer(t *testing.T) {
	for i := range 50 {
		s := kubeinformers.New(fake.NewClientset())
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		get := func(f informers.SharedInformerFactory) cache.SharedIndexInformer {
			inf := f.Core().V1().Namespaces().Informer()
			// Another user starts the factory now; give it every chance
			// to run (a bounded number of yields, never a wait: with
			// Start held off it simply finds the informer ready later).
			go func() { s.Start(ctx); close(done) }()
			for range 1000 {
				select {
				case <-done:
					return inf
				default:
					runtime.Gosched()
				}
			}
			return inf
		}
		_, err := s.Informer("namespaces", get, func(context.Context, *cache.Reflector, error) {})
		<-done
		cancel()
		s.Shutdown()
		if err != nil {
			t.Fatalf("round %d: Informer while another user starts the factory: %v", i, err)
		}
	}
}
