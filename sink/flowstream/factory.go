package flowstream

import (
	"context"
	"net"
	"time"

	"sluice/config"
	"sluice/flow"
	"sluice/ring"
	"sluice/sink"
)

// Factory is the flowStreamService sink: FlowStreamService.GetFlows over
// TLS, with the collectors' server certificate.
func Factory() sink.Factory {
	return sink.Factory{Key: config.SinkFlowStreamService, Proxy: true, New: newFromConfig}
}

// service is the Server as a sink: it binds its address when made, and
// serves until the buffer closes and its streams are done.
type service struct {
	srv *Server
	ln  net.Listener
}

func newFromConfig(env sink.Env) (sink.Sink, error) {
	cfg := env.Config
	// Renewed certificates (sluice.tls.reloadInterval) serve new
	// connections, as on the collectors.
	tlsConfig, err := env.ServerTLS(false)
	if err != nil {
		return nil, err
	}
	srv, err := New(Options{Buffer: env.Buffer, TLS: tlsConfig, Log: env.Log, Metrics: NewMetrics(env.Registry)})
	if err != nil {
		return nil, cfg.KeyError("flowStreamService.enable", err)
	}
	ln, err := net.Listen("tcp", cfg.Sluice.FlowStreamAddress)
	if err != nil {
		return nil, cfg.KeyError("sluice.flowStreamAddress", err)
	}
	return &service{srv: srv, ln: ln}, nil
}

// Addr is the address the service listens on.
func (s *service) Addr() string { return s.ln.Addr().String() }

// Close releases the listener of a service that never ran.
func (s *service) Close() error { return s.ln.Close() }

// Run serves; c is not read, since each stream reads the buffer through an
// observer of its own.
func (s *service) Run(ctx context.Context, c *ring.Consumer[*flow.Flow]) error {
	c.Close()
	return s.srv.ServeUntilClosed(ctx, s.ln)
}

// ServeUntilClosed is Serve until the buffer closes: then the streams
// still open send what they follow up to its end (bounded by StopTimeout)
// and the server stops. It returns at once when ctx ends.
func (s *Server) ServeUntilClosed(ctx context.Context, ln net.Listener) error {
	serveCtx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		select {
		case <-s.o.Buffer.Done():
		case <-serveCtx.Done():
			return
		}
		// A following stream ends by itself at the end of the closed
		// buffer; wait for that (bounded), then stop the rest.
		deadline := time.Now().Add(s.o.StopTimeout)
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for len(s.slots) > 0 && time.Now().Before(deadline) {
			select {
			case <-t.C:
			case <-serveCtx.Done():
				return
			}
		}
		stop()
	}()
	return s.Serve(serveCtx, ln)
}

// BestEffort marks the service as a sink that promises no delivery: live
// views come and go, and what they miss is theirs to count.
func (s *service) BestEffort() {}
