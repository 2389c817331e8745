package clickhouse

import (
	"testing"

	"sluice/flow/flowtest"
)

// TestClusterUUIDColumn: with the cluster's UUID known, the clusterUUID
// column is that UUID, as the reference writes it, even when clusterID
// names the records otherwise; without it, the record's clusterId.
func TestClusterUUIDColumn(t *testing.T) {
	const uuid = "8f3b2c1d-4e5f-4a6b-9c7d-0e1f2a3b4c5d"
	f := flowtest.Full(0, true)
	f.ClusterID = "custom-cluster-id"
	slot := columnSlots["clusterUUID"]
	if slot.kind != kStr {
		t.Fatalf("clusterUUID slot %+v", slot)
	}
	for _, c := range []struct{ cluster, want string }{{uuid, uuid}, {"", "custom-cluster-id"}} {
		b := newBlock("default", nil)
		b.clusterUUID = c.cluster
		b.add(f)
		if got := b.strs[slot.idx][0]; got != c.want {
			t.Errorf("cluster %q: clusterUUID %q, want %q", c.cluster, got, c.want)
		}
	}
}
