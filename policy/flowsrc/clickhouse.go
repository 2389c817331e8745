package flowsrc

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"time"

	ch "github.com/ClickHouse/clickhouse-go/v2"

	"sluice/sink/clickhouse"
)

// ClickHouse is the ClickHouse sink's flows table: URL is
// tcp://HOST:9000/DB or tls://HOST:9440/DB (the database defaults to
// "default"); credentials come from CH_USERNAME and CH_PASSWORD, as the
// aggregator's.
type ClickHouse struct{ URL string }

func (c *ClickHouse) String() string { return c.URL }

// chColumns are read from the flows table, in Scan order.
const chColumns = `flowStartSeconds, flowEndSeconds, sourceIP, destinationIP, sourceTransportPort,
destinationTransportPort, protocolIdentifier, sourcePodNamespace, sourcePodName,
destinationPodNamespace, destinationPodName, destinationClusterIP, destinationServicePortName,
ingressNetworkPolicyName, ingressNetworkPolicyNamespace, ingressNetworkPolicyRuleName,
ingressNetworkPolicyRuleAction, ingressNetworkPolicyType, egressNetworkPolicyName,
egressNetworkPolicyNamespace, egressNetworkPolicyRuleName, egressNetworkPolicyRuleAction,
egressNetworkPolicyType`

// Read implements Source: one query, rows streamed.
func (c *ClickHouse) Read(ctx context.Context, since time.Time, fn func(*Record) error) error {
	u, err := url.Parse(c.URL)
	if err != nil {
		return fmt.Errorf("ClickHouse %s: %w", c.URL, err)
	}
	if u.Scheme != "tcp" && u.Scheme != "tls" {
		return fmt.Errorf("ClickHouse %s: scheme %q: want tcp or tls (the native protocol)", c.URL, u.Scheme)
	}
	hostport, _, secure, err := clickhouse.ParseURL(c.URL)
	if err != nil {
		return fmt.Errorf("ClickHouse: %w", err)
	}
	db := strings.Trim(u.Path, "/")
	if db == "" {
		db = "default"
	}
	if strings.ContainsAny(db, "/`") {
		return fmt.Errorf("ClickHouse %s: %q is not a database name", c.URL, db)
	}
	o := &ch.Options{Addr: []string{hostport}, DialTimeout: 10 * time.Second, MaxOpenConns: 1,
		Auth: ch.Auth{Database: db, Username: os.Getenv("CH_USERNAME"), Password: os.Getenv("CH_PASSWORD")}}
	if secure {
		o.TLS = &tls.Config{ServerName: u.Hostname(), MinVersion: tls.VersionTLS12}
	}
	conn, err := ch.Open(o)
	if err != nil {
		return fmt.Errorf("ClickHouse %s: %w", c.URL, err)
	}
	defer conn.Close()
	q := "SELECT " + chColumns + " FROM `" + db + "`.flows"
	var args []any
	if !since.IsZero() {
		q += " WHERE flowEndSeconds >= ?"
		args = append(args, since.UTC())
	}
	rows, err := conn.Query(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("ClickHouse %s: %w", c.URL, err)
	}
	defer rows.Close()
	var (
		r        Record
		src, dst string
		cip      string
	)
	for rows.Next() {
		r = Record{}
		if err := rows.Scan(&r.Start, &r.End, &src, &dst, &r.SrcPort, &r.DstPort, &r.Proto,
			&r.SrcNamespace, &r.SrcPod, &r.DstNamespace, &r.DstPod, &cip, &r.ServicePortName,
			&r.Ingress.Name, &r.Ingress.Namespace, &r.Ingress.RuleName, &r.Ingress.RuleAction, &r.Ingress.Type,
			&r.Egress.Name, &r.Egress.Namespace, &r.Egress.RuleName, &r.Egress.RuleAction, &r.Egress.Type); err != nil {
			return fmt.Errorf("ClickHouse %s: %w", c.URL, err)
		}
		if r.Src, err = netip.ParseAddr(src); err != nil {
			return fmt.Errorf("ClickHouse %s: sourceIP %q: %w", c.URL, src, err)
		}
		if r.Dst, err = netip.ParseAddr(dst); err != nil {
			return fmt.Errorf("ClickHouse %s: destinationIP %q: %w", c.URL, dst, err)
		}
		r.Src, r.Dst = r.Src.Unmap(), r.Dst.Unmap()
		if r.ClusterIP, err = addr(cip); err != nil {
			return fmt.Errorf("ClickHouse %s: destinationClusterIP %q: %w", c.URL, cip, err)
		}
		r.Start, r.End = zeroEpoch(r.Start), zeroEpoch(r.End)
		if err := fn(&r); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("ClickHouse %s: %w", c.URL, err)
	}
	return nil
}

// zeroEpoch reads the DateTime 0 (an unset time) as the zero time, as the
// flow log's 0 is, and every time in UTC.
func zeroEpoch(t time.Time) time.Time {
	if t.Unix() == 0 {
		return time.Time{}
	}
	return t.UTC()
}
