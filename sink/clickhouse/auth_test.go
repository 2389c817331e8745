package clickhouse_test

import (
	"fmt"
	"strings"
	"testing"

	"sluice/flow"
	"sluice/internal/testkit"
	"sluice/internal/testkit/chserver"
	"sluice/internal/testkit/stubcollector"
	"sluice/internal/testkit/testagg"
)

// TestWrongPassword: ClickHouse refuses the credentials; the log says so
// and names the variables to fix, while the aggregator keeps running and
// its other sink gets every record.
func TestWrongPassword(t *testing.T) {
	srv := chserver.Start(t, chserver.Options{Users: map[string]string{"sluice": "right"}})
	t.Setenv("CH_USERNAME", "sluice")
	t.Setenv("CH_PASSWORD", "wrong")
	coll := stubcollector.New(t)
	a := testagg.Start(t, fmt.Sprintf(`
mode: Proxy
aggregatorTransportProtocol: tcp
flowCollector: {enable: true, address: "%s:tcp"}
clickHouse: {enable: true, databaseURL: "tcp://%s", commitInterval: 1s, createSchema: true}
sluice: {ipfixAddress: "127.0.0.1:0", apiAddress: "127.0.0.1:0"}
`, coll.Addr(), srv.Addr))
	sendHalves(t, a.Addrs().IPFIX, 1, 20, sourceHalf)
	testkit.WaitFor(t, "the other sink's records", func() bool { return coll.Len() == 20 })
	want := `ClickHouse refused the credentials of user \"sluice\" (set CH_USERNAME and CH_PASSWORD)`
	testkit.WaitFor(t, "the refusal in the log", func() bool { return strings.Contains(a.Logs(), want) })
	sendHalves(t, a.Addrs().IPFIX, 2, 20, func(i int, f *flow.Flow) { f.SourcePort += 1000 })
	testkit.WaitFor(t, "more records at the other sink", func() bool { return coll.Len() == 40 })
	if err := a.Stop(); err != nil {
		t.Errorf("the aggregator failed: %v", err)
	}
	if !strings.Contains(a.Logs(), `rows not inserted into ClickHouse are lost" sink=clickHouse rows=40`) {
		t.Errorf("the loss at shutdown is not logged")
	}
}

// TestTLSWithCACert: the native protocol over TLS to ClickHouse's secure
// port, the server's certificate checked against clickHouse.tls.caFile.
func TestTLSWithCACert(t *testing.T) {
	srv := chserver.Start(t, chserver.Options{TLS: true})
	a := testagg.Start(t, fmt.Sprintf(`
mode: Proxy
aggregatorTransportProtocol: tcp
clickHouse:
  enable: true
  databaseURL: "tls://%s"
  commitInterval: 1s
  createSchema: true
  tls: {caCert: true, caFile: %q}
sluice: {ipfixAddress: "127.0.0.1:0", apiAddress: "127.0.0.1:0"}
`, srv.SecureAddr, srv.CAFile))
	sendHalves(t, a.Addrs().IPFIX, 1, 20, sourceHalf)
	conn := srv.Conn()
	testkit.WaitFor(t, "20 rows over TLS", func() bool { return srv.Count(conn, "flows") == 20 })
	if err := a.Stop(); err != nil {
		t.Fatal(err)
	}
}
