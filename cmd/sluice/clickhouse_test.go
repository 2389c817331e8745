package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestClickHouseSchema(t *testing.T) {
	for _, c := range []struct {
		args      []string
		want, not []string
	}{
		{[]string{"clickhouse", "schema", "--ttl", "12h"},
			[]string{"CREATE TABLE IF NOT EXISTS `default`.flows", "TTL timeInserted + INTERVAL 43200 SECOND", "LowCardinality(String)",
				"CREATE MATERIALIZED VIEW IF NOT EXISTS `default`.flows_policy_view"}, nil},
		{[]string{"clickhouse", "schema", "--server-version", "18.16", "--database", "fa", "--ttl", "1h"},
			[]string{"-- left out for ClickHouse 18.16: TTL", "CREATE TABLE IF NOT EXISTS `fa`.flows", "destinationServiceIP String"},
			[]string{"Namespace LowCardinality(String)", "TTL timeInserted"}},
	} {
		var out bytes.Buffer
		root := newRootCmd()
		root.SetOut(&out)
		root.SetArgs(c.args)
		if err := root.Execute(); err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		for _, w := range c.want {
			if !strings.Contains(out.String(), w) {
				t.Errorf("%v: output lacks %q", c.args, w)
			}
		}
		for _, w := range c.not {
			if strings.Contains(out.String(), w) {
				t.Errorf("%v: output has %q", c.args, w)
			}
		}
		if n := strings.Count(out.String(), ";\n"); n != 4 {
			t.Errorf("%v: %d statements", c.args, n)
		}
	}
}
