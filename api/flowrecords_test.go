package api

import (
	"net/netip"
	"net/url"
	"strings"
	"testing"
)

func TestParseFlowQuery(t *testing.T) {
	v, _ := url.ParseQuery("srcip=10.0.0.1&dstip=fd00::2&proto=UDP&srcport=53&dstport=5353&limit=7")
	q, err := ParseFlowQuery(v)
	if err != nil {
		t.Fatal(err)
	}
	if q.SrcIP != netip.MustParseAddr("10.0.0.1") || q.DstIP != netip.MustParseAddr("fd00::2") || q.Proto != 17 ||
		q.SrcPort != 53 || q.DstPort != 5353 || q.Limit != 7 {
		t.Errorf("%+v", q)
	}
	if q, _ := ParseFlowQuery(nil); q.Limit != DefaultFlowRecordsLimit || q.SrcIP.IsValid() || q.Proto != 0 {
		t.Errorf("no filters: %+v", q)
	}
	for _, bad := range []string{"srcip=10.0.0", "dstport=65536", "proto=tcpx", "proto=256", "limit=0", "limit=x", "srcport=-1"} {
		v, _ := url.ParseQuery(bad)
		_, err := ParseFlowQuery(v)
		if err == nil || !strings.HasPrefix(err.Error(), strings.SplitN(bad, "=", 2)[0]+":") {
			t.Errorf("%s: error %v, want one naming the parameter", bad, err)
		}
	}
}
