// Package source defines what the exporter reads connections from: a
// snapshot of a connection table, in the shape of a Linux conntrack entry,
// taken once per poll.
package source

import (
	"context"
	"net/netip"
	"time"
)

// Conn is one tracked connection as a source sees it at dump time.
type Conn struct {
	// ID identifies the entry for its lifetime; a new entry reusing the same
	// tuple gets a new ID. Zero means the source has no IDs.
	ID    uint32
	Proto uint8
	// OrigSrc and OrigDst are the original direction's tuple (as the
	// client sent it); ReplySrc and ReplyDst the reply direction's. After
	// DNAT (a Service), ReplySrc is the chosen endpoint; after SNAT,
	// ReplyDst is the translated source.
	OrigSrc, OrigDst, ReplySrc, ReplyDst netip.AddrPort
	// Counters of the original and the reply direction, in packets and
	// layer-3 octets.
	Packets, Bytes, ReversePackets, ReverseBytes uint64
	// TCPState is the conntrack TCP state (TCPEstablished …), 0 for other
	// protocols.
	TCPState uint8
	// Dying is set once the kernel has started removing the entry.
	Dying bool
	// Start is when the entry was created, zero if the source does not
	// know (conntrack without timestamps).
	Start time.Time
}

// Source yields the current connections.
type Source interface {
	// Dump appends every current connection to dst and returns it.
	Dump(ctx context.Context, dst []Conn) ([]Conn, error)
	// Close releases the source.
	Close() error
}

// Linux conntrack TCP states (enum tcp_conntrack).
const (
	TCPNone uint8 = iota
	TCPSynSent
	TCPSynRecv
	TCPEstablished
	TCPFinWait
	TCPCloseWait
	TCPLastAck
	TCPTimeWait
	TCPClose
	TCPSynSent2
)

var tcpStateNames = [...]string{"NONE", "SYN_SENT", "SYN_RECV", "ESTABLISHED", "FIN_WAIT", "CLOSE_WAIT",
	"LAST_ACK", "TIME_WAIT", "CLOSE", "SYN_SENT2"}

// TCPStateName is the name Antrea agents export in tcpState.
func TCPStateName(s uint8) string {
	if int(s) < len(tcpStateNames) {
		return tcpStateNames[s]
	}
	return "UNKNOWN"
}

// Protocol numbers the exporter tells apart.
const (
	ProtoTCP  uint8 = 6
	ProtoUDP  uint8 = 17
	ProtoSCTP uint8 = 132
)
