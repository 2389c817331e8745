package testkit_test

import (
	"errors"
	"net"
	"syscall"
	"testing"

	"sluice/internal/testkit"
)

// TestReservePort: a held port refuses connections, cannot be taken by
// another socket, and accepts once Listen is called on it.
func TestReservePort(t *testing.T) {
	p := testkit.ReservePort(t)
	if _, err := net.Dial("tcp", p.Addr); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial a held port: %v, want connection refused", err)
	}
	if ln, err := net.Listen("tcp", p.Addr); err == nil {
		ln.Close()
		t.Fatal("another socket could listen on the held port")
	}
	ln, err := p.Listen()
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if ln.Addr().String() != p.Addr {
		t.Errorf("listening on %s, want %s", ln.Addr(), p.Addr)
	}
	c, err := net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatalf("dial after Listen: %v", err)
	}
	c.Close()
	if _, err := p.Listen(); err == nil {
		t.Error("a second Listen succeeded")
	}
}
