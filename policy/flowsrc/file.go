package flowsrc

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"sluice/flow"
)

// maxLine bounds one flow log line; a longer one is an error, not a
// memory spike.
const maxLine = 64 << 10

// File is a flow log file; a name ending in .gz is read through gzip (the
// flowLogger sink's compressed backups).
type File struct{ Path string }

func (f *File) String() string { return f.Path }

// Read implements Source.
func (f *File) Read(ctx context.Context, since time.Time, fn func(*Record) error) error {
	fh, err := os.Open(f.Path)
	if err != nil {
		return fmt.Errorf("flow log: %w", err)
	}
	defer fh.Close()
	var r io.Reader = fh
	if strings.HasSuffix(f.Path, ".gz") {
		gz, err := gzip.NewReader(fh)
		if err != nil {
			return fmt.Errorf("flow log %s: %w", f.Path, err)
		}
		defer gz.Close()
		r = gz
	}
	return ReadLog(ctx, r, f.Path, since, fn)
}

// ReadLog reads flow log lines from r; name labels errors.
func ReadLog(ctx context.Context, r io.Reader, name string, since time.Time, fn func(*Record) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxLine)
	var rec Record
	for n := 1; sc.Scan(); n++ {
		if n%4096 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		line := bytes.TrimRight(sc.Bytes(), "\r")
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		if err := ParseLine(line, &rec); err != nil {
			return fmt.Errorf("flow log %s line %d: %w", name, n, err)
		}
		if !since.IsZero() && rec.End.Before(since) {
			continue
		}
		if err := fn(&rec); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("flow log %s: %w", name, err)
	}
	return nil
}

// logFields is the number of fields of a flowLogger line.
const logFields = 30

// ParseLine reads one flowLogger line (either the numeric or the
// prettyPrint spelling of protocols, actions and policy types) into r.
func ParseLine(line []byte, r *Record) error {
	var f [logFields]string
	s := string(line)
	for i := range logFields {
		j := strings.IndexByte(s, ',')
		if i == logFields-1 {
			if j >= 0 {
				return fmt.Errorf("more than %d comma-separated fields", logFields)
			}
			f[i] = s
			break
		}
		if j < 0 {
			return fmt.Errorf("%d comma-separated fields, want %d", i+1, logFields)
		}
		f[i], s = s[:j], s[j+1:]
	}
	*r = Record{}
	var err error
	if r.Start, err = seconds(f[0]); err != nil {
		return fmt.Errorf("flowStartSeconds: %w", err)
	}
	if r.End, err = seconds(f[1]); err != nil {
		return fmt.Errorf("flowEndSeconds: %w", err)
	}
	if r.Src, err = addr(f[2]); err != nil || !r.Src.IsValid() {
		return fmt.Errorf("sourceIP %q: not an address", f[2])
	}
	if r.Dst, err = addr(f[3]); err != nil || !r.Dst.IsValid() {
		return fmt.Errorf("destinationIP %q: not an address", f[3])
	}
	if r.SrcPort, err = port(f[4]); err != nil {
		return fmt.Errorf("sourceTransportPort: %w", err)
	}
	if r.DstPort, err = port(f[5]); err != nil {
		return fmt.Errorf("destinationTransportPort: %w", err)
	}
	if r.Proto, err = ParseProtocol(f[6]); err != nil {
		return fmt.Errorf("protocolIdentifier: %w", err)
	}
	r.SrcPod, r.SrcNamespace = f[7], f[8]
	r.DstPod, r.DstNamespace = f[10], f[11]
	if r.ClusterIP, err = addr(f[13]); err != nil {
		return fmt.Errorf("destinationClusterIP %q: not an address", f[13])
	}
	r.ServicePortName = f[16]
	if err := policy(f[17:22], &r.Ingress); err != nil {
		return fmt.Errorf("ingress policy: %w", err)
	}
	if err := policy(f[22:27], &r.Egress); err != nil {
		return fmt.Errorf("egress policy: %w", err)
	}
	return nil
}

func seconds(s string) (time.Time, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return time.Time{}, fmt.Errorf("%q is not a count of seconds", s)
	}
	if n == 0 {
		return time.Time{}, nil
	}
	return time.Unix(n, 0).UTC(), nil
}

func addr(s string) (netip.Addr, error) {
	if s == "" {
		return netip.Addr{}, nil
	}
	a, err := netip.ParseAddr(s)
	return a.Unmap(), err
}

func port(s string) (uint16, error) {
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil {
		return 0, fmt.Errorf("%q is not a port", s)
	}
	return uint16(n), nil
}

// ParseProtocol reads an IP protocol as a number or a name (TCP, UDP,
// ICMP, ICMPv6 or IPv6-ICMP, SCTP).
func ParseProtocol(s string) (uint8, error) {
	switch strings.ToUpper(s) {
	case "TCP":
		return 6, nil
	case "UDP":
		return 17, nil
	case "ICMP":
		return 1, nil
	case "ICMPV6", "IPV6-ICMP":
		return 58, nil
	case "SCTP":
		return 132, nil
	}
	n, err := strconv.ParseUint(s, 10, 8)
	if err != nil {
		return 0, fmt.Errorf("%q is not a protocol", s)
	}
	return uint8(n), nil
}

// policy reads name, namespace, rule name, rule action and type.
func policy(f []string, p *flow.Policy) error {
	p.Name, p.Namespace, p.RuleName = f[0], f[1], f[2]
	var err error
	if p.RuleAction, err = parseAction(f[3]); err != nil {
		return err
	}
	p.Type, err = parsePolicyType(f[4])
	return err
}

func parseAction(s string) (uint8, error) {
	switch s {
	case "", "0":
		return flow.ActionNone, nil
	case "Allow", "1":
		return flow.ActionAllow, nil
	case "Drop", "2":
		return flow.ActionDrop, nil
	case "Reject", "3":
		return flow.ActionReject, nil
	}
	return 0, fmt.Errorf("rule action %q: want Allow, Drop, Reject or empty", s)
}

func parsePolicyType(s string) (uint8, error) {
	switch s {
	case "", "0":
		return 0, nil
	case "K8sNetworkPolicy", "1":
		return 1, nil
	case "AntreaNetworkPolicy", "2":
		return 2, nil
	case "AntreaClusterNetworkPolicy", "3":
		return 3, nil
	case "K8sClusterNetworkPolicy", "4":
		return 4, nil
	case "Invalid":
		return 255, nil
	}
	return 0, fmt.Errorf("policy type %q is not one the flow log writes", s)
}
