package kafkain

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"sluice/flow"
	"sluice/internal/testkit"
	"sluice/ring"
)

// A part past its horizon is forgotten only once the sinks wrote every
// export produced before the cut: an export under another key than its
// records' (or not yet read by readExports) must still be written before
// the commit passes the records.
func TestCommitExpiresOnlyWhatIsWritten(t *testing.T) {
	ck := &clock{time.Unix(1000, 0)}
	buf := ring.New[*flow.Flow](16)
	in, err := New(Options{Topic: "t", Group: "g", Out: make(chan flow.Batch), Exports: buf,
		Horizon: time.Minute, CommitInterval: 10 * time.Millisecond, Now: ck.now,
		Client: []kgo.Opt{kgo.SeedBrokers(testkit.RefusedAddr(t))}})
	if err != nil {
		t.Fatal(err)
	}
	defer in.cl.Close()
	sinkC := buf.Consumer()
	sinkC.CommitOnWrite() // a sink that has not written what it read
	in.t.assign(0, -1, -1)
	a, _, _ := in.t.fetched("a", 0, 0)
	in.t.resolved([]*part{a}, buf.Produced(), map[int32]int64{0: 1})
	buf.Produce(&flow.Flow{}) // the flow's export, under some other key
	if _, ok := sinkC.Next(context.Background(), nil, 1); !ok {
		t.Fatal("sink consumer read nothing")
	}
	ck.t = ck.t.Add(2 * time.Minute)

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	in.commit(ctx)
	cancel()
	if n := in.t.live(); n != 1 {
		t.Fatalf("%d flows held after a commit while the sink had not written the export, want 1", n)
	}
	sinkC.Commit(0)
	in.t.expire(time.Time{}) // nothing more: only commit expires
	ctx, cancel = context.WithTimeout(context.Background(), 50*time.Millisecond)
	in.commit(ctx)
	cancel()
	if n := in.t.live(); n != 0 {
		t.Fatalf("%d flows held once the export was written and the horizon passed, want 0", n)
	}
}
