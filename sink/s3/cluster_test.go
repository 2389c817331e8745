package s3

import (
	"strings"
	"testing"
	"time"

	"sluice/flow/flowtest"
)

// TestClusterUUIDColumn: with the cluster's UUID known, the clusterUUID
// field of every row is that UUID, as the reference writes it, even when
// clusterID names the records otherwise; without it, the record's
// clusterId.
func TestClusterUUIDColumn(t *testing.T) {
	const uuid = "8f3b2c1d-4e5f-4a6b-9c7d-0e1f2a3b4c5d"
	f := flowtest.Full(0, true)
	f.ClusterID = "custom-cluster-id"
	written := time.Unix(1700000000, 0)
	for _, c := range []struct{ cluster, want string }{{uuid, uuid}, {"", "custom-cluster-id"}} {
		csv := newCSVEncoder(false, c.cluster)
		if err := csv.add(f, written); err != nil {
			t.Fatal(err)
		}
		fields := strings.Split(strings.TrimSuffix(string(csv.line), "\n"), ",")
		// clusterUUID is the fifth field from the end (then the upload
		// time and the three Egress fields).
		if got := fields[len(fields)-5]; got != c.want {
			t.Errorf("cluster %q: CSV clusterUUID %q, want %q (row %s)", c.cluster, got, c.want, csv.line)
		}
		pq := newParquetEncoder(false, c.cluster)
		if err := pq.add(f, written); err != nil {
			t.Fatal(err)
		}
		if got := pq.batch[0].ClusterUUID; got != c.want {
			t.Errorf("cluster %q: Parquet clusterUUID %q, want %q", c.cluster, got, c.want)
		}
	}
}
