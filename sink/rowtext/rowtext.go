// Package rowtext writes flow record values as text fields of a
// comma-separated row, the way Antrea's flow log and S3 rows spell them:
// shared by sink/flowlog and sink/s3 so that both rows stay alike.
package rowtext

import (
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// AppendSeconds writes t as Unix seconds, 0 for an unset time.
func AppendSeconds(b []byte, t time.Time) []byte {
	if t.IsZero() {
		return append(b, '0')
	}
	return strconv.AppendInt(b, t.Unix(), 10)
}

// AppendAddr writes an address, or nothing for an unset one; an
// IPv4-mapped one as IPv4, as the IPFIX export sends it.
func AppendAddr(b []byte, a netip.Addr) []byte {
	if !a.IsValid() {
		return b
	}
	return a.Unmap().AppendTo(b)
}

// AppendText writes s; a line break inside a value would split the row in
// two, so CR and LF become spaces (nothing else is escaped, as in the
// reference's format).
func AppendText(b []byte, s string) []byte {
	if !strings.ContainsAny(s, "\r\n") {
		return append(b, s...)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '\r' || c == '\n' {
			c = ' '
		}
		b = append(b, c)
	}
	return b
}
