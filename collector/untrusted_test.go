package collector_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/encoding/protowire"

	"sluice/certs"
	"sluice/flow/flowpb"
	"sluice/flow/flowtest"
	"sluice/internal/testkit"
)

// rotation is a collector serving IPFIX over TLS and gRPC with the
// certificates of a reloader over b's files, whose CA changes close the
// connections that no longer verify. The test drives the reloader with
// Check.
type rotation struct {
	h          *harness
	b          *certs.Bundle // the starting material (its files change)
	r          *certs.Reloader
	tls, grpc  string // addresses
	rechecks   chan [2]int
	mu         sync.Mutex
	arrived    map[string]int // records out of the collector, by transport
	collectCtx context.Context
}

func newRotation(t *testing.T) *rotation {
	t.Helper()
	h := newHarness(t, 64)
	b := bundle(t)
	p := b.Paths
	r, err := certs.NewReloader(b, certs.ReloadOptions{
		Load:     func() (*certs.Bundle, error) { return certs.Load(p.ServerCert, p.ServerKey, p.CACert) },
		Files:    []string{p.ServerCert, p.ServerKey, p.CACert},
		Interval: time.Hour, // the test calls Check
	})
	if err != nil {
		t.Fatal(err)
	}
	ro := &rotation{h: h, b: b, r: r, rechecks: make(chan [2]int, 4), arrived: map[string]int{}}
	r.OnCAChange(func(pool *x509.CertPool) {
		checked, closed := h.srv.CloseUntrusted(pool)
		ro.rechecks <- [2]int{checked, closed}
	})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ro.collectCtx = ctx
	listen := func() net.Listener {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		return ln
	}
	tlsLn, grpcLn := listen(), listen()
	ro.tls, ro.grpc = tlsLn.Addr().String(), grpcLn.Addr().String()
	h.wg.Add(3)
	go func() { defer h.wg.Done(); h.srv.ServeTCP(ctx, tlsLn, r.ServerTLS(true)) }()
	go func() {
		defer h.wg.Done()
		if err := h.srv.ServeGRPC(ctx, grpcLn, r.ServerTLS(true)); err != nil {
			t.Errorf("ServeGRPC: %v", err)
		}
	}()
	go func() {
		defer h.wg.Done()
		for {
			select {
			case b := <-h.out:
				ro.mu.Lock()
				for _, f := range b.Flows {
					ro.arrived[f.Origin.Transport]++
				}
				ro.mu.Unlock()
			case <-ctx.Done():
				return
			}
		}
	}()
	return ro
}

func (ro *rotation) got(transport string) int {
	ro.mu.Lock()
	defer ro.mu.Unlock()
	return ro.arrived[transport]
}

// received is what the collector counted as received on transport.
func (ro *rotation) received(transport string) int {
	return int(testutil.ToFloat64(ro.h.m.Records.WithLabelValues(transport, "127.0.0.1")))
}

// replace puts the server certificate, key and CA file contents in place
// of the reloader's files, each renamed over the old one, and reloads.
func (ro *rotation) replace(t *testing.T, serverCert, serverKey, ca []byte) {
	t.Helper()
	p := ro.b.Paths
	for path, data := range map[string][]byte{p.ServerCert: serverCert, p.ServerKey: serverKey, p.CACert: ca} {
		if err := os.WriteFile(path+".new", data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".new", path); err != nil {
			t.Fatal(err)
		}
	}
	if !ro.r.Check() {
		t.Fatal("the reloader did not load the new files")
	}
}

// recheck is what the last CA change's check found: connections checked
// and closed.
func (ro *rotation) recheck(t *testing.T) (checked, closed int) {
	t.Helper()
	select {
	case c := <-ro.rechecks:
		return c[0], c[1]
	case <-time.After(testkit.WaitTimeout):
		t.Fatal("the CA change did not check the open connections")
		return 0, 0
	}
}

// stream keeps sending records on an IPFIX/TLS session and a gRPC stream
// made with cfg, paced, until either fails or stop is called. It returns
// once a record of each arrived.
type stream struct {
	tc      *tls.Conn
	conn    *grpc.ClientConn
	st      grpc.ClientStream
	done    sync.WaitGroup
	stopped chan struct{}
	once    sync.Once
}

func (ro *rotation) stream(t *testing.T, cfg *tls.Config) *stream {
	t.Helper()
	s := &stream{stopped: make(chan struct{})}
	var err error
	if s.tc, err = tls.Dial("tcp", ro.tls, cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.tc.Close() })
	if s.conn, err = grpc.NewClient(ro.grpc, grpc.WithTransportCredentials(credentials.NewTLS(cfg))); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.conn.Close() })
	if s.st, err = s.conn.NewStream(ro.collectCtx, &grpc.StreamDesc{ClientStreams: true}, flowpb.FlowExportService_Export_FullMethodName, grpc.ForceCodec(rawCodec{})); err != nil {
		t.Fatal(err)
	}
	req := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), flowtest.Wire(flowtest.Full(1, false), nil, nil))
	msgs := antrea(t, 1, 0, 1400) // a template and a record
	tlsBefore, grpcBefore := ro.got("tls"), ro.got("grpc")
	// Paced: a load, not a flood, on a shared machine.
	pace := func(send func() error) {
		defer s.done.Done()
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			if send() != nil {
				return
			}
			select {
			case <-tick.C:
			case <-s.stopped:
				return
			}
		}
	}
	s.done.Add(2)
	go pace(func() error {
		for _, m := range msgs {
			if _, err := s.tc.Write(m); err != nil {
				return err
			}
		}
		return nil
	})
	go pace(func() error { return s.st.SendMsg(req) })
	testkit.WaitFor(t, "records of both transports", func() bool {
		return ro.got("tls") > tlsBefore && ro.got("grpc") > grpcBefore
	})
	return s
}

// stop ends the sending; it may be called again.
func (s *stream) stop() {
	s.once.Do(func() { close(s.stopped) })
	s.done.Wait()
}

// closedByServer says whether the server closed both connections: the
// IPFIX/TLS one reads an error, the gRPC stream ends in one. It stops the
// sending first.
func (s *stream) closedByServer(t *testing.T) bool {
	t.Helper()
	s.stop()
	s.tc.SetReadDeadline(time.Now().Add(testkit.WaitTimeout))
	if _, err := s.tc.Read(make([]byte, 1)); err == nil {
		t.Error("the IPFIX/TLS session read data from the collector")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return false
	}
	s.st.CloseSend()
	var resp []byte
	return s.st.RecvMsg(&resp) != nil
}

// TestCARotationClosesUntrustedConnections: when the CA file is replaced
// by a new CA alone, the IPFIX/TLS session and the gRPC stream accepted
// with the old CA's client certificate are closed and counted; what they
// delivered before is kept; certificates of the new CA connect; and the
// closed connections leave the set of watched ones.
func TestCARotationClosesUntrustedConnections(t *testing.T) {
	ro := newRotation(t)
	old := ro.stream(t, ro.b.ClientTLS("localhost"))
	defer old.stop()

	next := bundle(t) // a new CA, with a server and a client certificate of its own
	ro.replace(t, pemFile(t, next.Paths.ServerCert), pemFile(t, next.Paths.ServerKey), pemFile(t, next.Paths.CACert))
	if checked, closed := ro.recheck(t); checked != 2 || closed != 2 {
		t.Errorf("the CA change checked %d connections and closed %d, want 2 and 2", checked, closed)
	}
	testkit.WaitFor(t, "one connection of each transport counted as closed for an untrusted certificate", func() bool {
		return testutil.ToFloat64(ro.h.m.CertsUntrustedClosed.WithLabelValues("tls")) == 1 &&
			testutil.ToFloat64(ro.h.m.CertsUntrustedClosed.WithLabelValues("grpc")) == 1
	})
	if !old.closedByServer(t) {
		t.Fatal("a connection of the old CA is still open")
	}
	// Every record the collector counted as received reached the pipeline.
	for _, tr := range []string{"tls", "grpc"} {
		testkit.WaitFor(t, tr+" records received all handed on", func() bool {
			return ro.got(tr) == ro.received(tr)
		})
	}
	if n := testutil.ToFloat64(ro.h.m.CertsExpiredClosed.WithLabelValues("tls")); n != 0 {
		t.Errorf("counted %v as closed at expiry", n)
	}

	// The new CA's certificates are accepted, on both transports.
	fresh := ro.stream(t, next.ClientTLS("localhost"))
	fresh.stop()
	fresh.tc.Close()
	fresh.conn.Close()
	// Closed connections are no longer watched: a check finds none.
	testkit.WaitFor(t, "no connection watched once all are closed", func() bool {
		checked, closed := ro.h.srv.CloseUntrusted(next.CAPool)
		return checked == 0 && closed == 0
	})
}

// TestCABundleWithBothKeepsConnections: a CA file holding the old CA and
// a new one (the first step of an overlapping rotation) keeps open the
// connections accepted with the old CA's certificate; they go on
// delivering after the reload.
func TestCABundleWithBothKeepsConnections(t *testing.T) {
	ro := newRotation(t)
	old := ro.stream(t, ro.b.ClientTLS("localhost"))
	defer old.stop()

	next := bundle(t)
	both := append(pemFile(t, ro.b.Paths.CACert), pemFile(t, next.Paths.CACert)...)
	ro.replace(t, pemFile(t, ro.b.Paths.ServerCert), pemFile(t, ro.b.Paths.ServerKey), both)
	if checked, closed := ro.recheck(t); checked != 2 || closed != 0 {
		t.Errorf("the CA change checked %d connections and closed %d, want 2 and 0", checked, closed)
	}
	tlsAt, grpcAt := ro.got("tls"), ro.got("grpc")
	testkit.WaitFor(t, "records of both transports after the reload", func() bool {
		return ro.got("tls") > tlsAt+10 && ro.got("grpc") > grpcAt+10
	})
	for _, tr := range []string{"tls", "grpc"} {
		if n := testutil.ToFloat64(ro.h.m.CertsUntrustedClosed.WithLabelValues(tr)); n != 0 {
			t.Errorf("%s: %v connections counted as closed for an untrusted certificate", tr, n)
		}
	}
}

func pemFile(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}
