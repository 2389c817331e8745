package kubeinformers_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	"sluice/internal/testkit"
	"sluice/kubeinformers"
)

func TestOneInformerPerResource(t *testing.T) {
	s := kubeinformers.New(fake.NewClientset())
	nodes := func(f informers.SharedInformerFactory) cache.SharedIndexInformer {
		return f.Core().V1().Nodes().Informer()
	}
	a, err := s.Informer("nodes", nodes, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.Start(ctx)
	b, err := s.Informer("nodes", nodes, func(context.Context, *cache.Reflector, error) {})
	if err != nil {
		t.Fatalf("second user of a started informer: %v", err)
	}
	if a != b || s.Informers() != 1 {
		t.Errorf("two informers of one resource (%d)", s.Informers())
	}
	cancel()
	s.Shutdown()
}

// TestWatchErrorsReachEveryUser: an informer has one watch-error handler;
// a failed list must reach each user's all the same.
func TestWatchErrorsReachEveryUser(t *testing.T) {
	cs := fake.NewClientset()
	cs.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("refused for the test")
	})
	s := kubeinformers.New(cs)
	pods := func(f informers.SharedInformerFactory) cache.SharedIndexInformer {
		return f.Core().V1().Pods().Informer()
	}
	var a, b atomic.Int32
	if _, err := s.Informer("pods", pods, func(context.Context, *cache.Reflector, error) { a.Add(1) }); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Informer("pods", pods, func(context.Context, *cache.Reflector, error) { b.Add(1) }); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); s.Shutdown() }()
	s.Start(ctx)
	testkit.WaitFor(t, "both users hear of the failed list", func() bool { return a.Load() > 0 && b.Load() > 0 })
}
