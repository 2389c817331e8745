package clickhouse_test

import (
	"strings"
	"testing"
	"time"

	"sluice/sink/clickhouse"
)

func TestSchemaByVersion(t *testing.T) {
	old, _ := clickhouse.ParseVersion("18.16.1")
	stmts, omitted := clickhouse.Schema(clickhouse.SchemaOptions{Database: "flowdb", TTL: time.Hour, Server: old})
	if len(stmts) != 4 || len(omitted) != 2 {
		t.Fatalf("18.16: %d statements, omitted %q", len(stmts), omitted)
	}
	for _, s := range stmts {
		if strings.Contains(s.SQL, "TTL") || strings.Contains(s.SQL, "LowCardinality") {
			t.Errorf("18.16 DDL has what 18.16 refuses:\n%s", s.SQL)
		}
	}
	stmts, omitted = clickhouse.Schema(clickhouse.SchemaOptions{TTL: time.Hour})
	if len(omitted) != 0 {
		t.Errorf("current server: omitted %q", omitted)
	}
	tbl := stmts[0].SQL
	for _, want := range []string{"CREATE TABLE IF NOT EXISTS `default`.flows", "TTL timeInserted + INTERVAL 3600 SECOND",
		"sourcePodNamespace LowCardinality(String)", "destinationServiceIP String", "timeInserted DateTime DEFAULT now()",
		"trusted UInt8 DEFAULT 0"} {
		if !strings.Contains(tbl, want) {
			t.Errorf("table DDL lacks %q:\n%s", want, tbl)
		}
	}
	// 51 reference columns, destinationServiceIP, timeInserted, trusted.
	if n := strings.Count(tbl, ",\n") + 1; n != 54 {
		t.Errorf("%d columns, want 54", n)
	}
	if len(clickhouse.Columns()) != 52 {
		t.Errorf("%d inserted columns, want 52", len(clickhouse.Columns()))
	}
	for _, bad := range []string{"18", "18.x", "a.b", ""} {
		if _, err := clickhouse.ParseVersion(bad); err == nil {
			t.Errorf("ParseVersion(%q) accepted", bad)
		}
	}
}

func TestParseURL(t *testing.T) {
	for _, c := range []struct {
		in, addr, proto string
		secure          bool
	}{
		{"tcp://ch:9000", "ch:9000", clickhouse.Native, false},
		{"tls://ch", "ch:9440", clickhouse.Native, true},
		{"http://ch:8123", "ch:8123", clickhouse.HTTP, false},
		{"https://[fd00::1]", "[fd00::1]:8443", clickhouse.HTTP, true},
	} {
		addr, proto, secure, err := clickhouse.ParseURL(c.in)
		if err != nil || addr != c.addr || proto != c.proto || secure != c.secure {
			t.Errorf("%s: %s %s %v %v", c.in, addr, proto, secure, err)
		}
	}
	if _, _, _, err := clickhouse.ParseURL("udp://ch:9000"); err == nil {
		t.Error("udp accepted")
	}
	if _, err := clickhouse.TLSConfig("ch:9440", false, true, "/nonexistent/ca.crt"); err == nil ||
		!strings.Contains(err.Error(), "caCert") {
		t.Errorf("a missing CA file: %v", err)
	}
}
