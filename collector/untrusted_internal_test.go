package collector

import (
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"sluice/certs"
	"sluice/internal/testkit/testcerts"
)

// BenchmarkCloseUntrusted: the cost of checking 1,000 open connections
// after a CA change that keeps them all trusted, when they share one
// client certificate (Antrea's agents do) and when each has its own.
func BenchmarkCloseUntrusted(b *testing.B) {
	dir := b.TempDir()
	bundle, err := certs.Ensure(dir, certs.Options{})
	if err != nil {
		b.Fatal(err)
	}
	const conns = 1000
	now := time.Now()
	for _, distinct := range []bool{false, true} {
		b.Run(fmt.Sprintf("distinct=%v", distinct), func(b *testing.B) {
			s := &Server{o: Options{Metrics: NewMetrics(nil)}, certConns: map[*certConn]struct{}{}}
			log := slog.New(slog.NewTextHandler(io.Discard, nil))
			shared := bundle.Client.Leaf
			for range conns {
				leaf := shared
				if distinct {
					c := testcerts.Client(b, dir, now.Add(-time.Minute), now.Add(time.Hour))
					if leaf, err = x509.ParseCertificate(c.Certificate[0]); err != nil {
						b.Fatal(err)
					}
				}
				s.certConns[&certConn{transport: "grpc", log: log, peer: []*x509.Certificate{leaf}, expiry: now.Add(time.Hour)}] = struct{}{}
			}
			for b.Loop() {
				if checked, closed := s.CloseUntrusted(bundle.CAPool); checked != conns || closed != 0 {
					b.Fatalf("checked %d, closed %d", checked, closed)
				}
			}
		})
	}
}
