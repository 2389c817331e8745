package stubcollector

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"sluice/flow"
	"sluice/internal/testkit"
	"sluice/internal/testkit/ipfixgen"
)

func flows(n int) []flow.Flow {
	now := time.Now().Truncate(time.Second)
	fs := make([]flow.Flow, n)
	for i := range fs {
		fs[i] = flow.Flow{StartTime: now.Add(-time.Second), EndTime: now,
			SourceIP: netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}), DestinationIP: netip.MustParseAddr("10.0.9.9"),
			SourcePort: uint16(1024 + i), DestinationPort: 443, Protocol: 6}
	}
	return fs
}

// TestOpen: a connection counts while it is read; once its sender closed
// it and Open is 0, every record it carried is there, the last message
// (sent right before the close) included.
func TestOpen(t *testing.T) {
	c := New(t)
	conn, err := net.Dial("tcp", c.Addr())
	if err != nil {
		t.Fatal(err)
	}
	fs := flows(300)
	if _, err := conn.Write(ipfixgen.Messages(t, 1, fs[:100])); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the first records", func() bool { return c.Len() >= 100 })
	if n := c.Open(); n != 1 {
		t.Errorf("Open = %d while the sender is connected, want 1", n)
	}
	if _, err := conn.Write(ipfixgen.Messages(t, 1, fs[100:])); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	testkit.WaitFor(t, "the connection to be read to its end", func() bool { return c.Open() == 0 })
	if n := c.Len(); n != len(fs) {
		t.Errorf("%d records once the connection ended, want %d", n, len(fs))
	}
	if errs := c.Errors(); len(errs) > 0 {
		t.Errorf("errors: %v", errs)
	}
}
