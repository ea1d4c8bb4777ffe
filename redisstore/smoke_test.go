package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/redistest"
	"github.com/floodgate/floodgate/redisstore"
)

func TestSmoke(t *testing.T) {
	srv := redistest.Standalone(t)
	s, err := redisstore.New("redis://"+srv.Addr, redisstore.Options{ClientTime: true, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	defer func() {
		if st := s.Stats(); st.Errors != 0 || st.Calls == 0 {
			t.Errorf("stats %+v", st)
		}
	}()
	for _, r := range []floodgate.Rule{
		{Algorithm: floodgate.TokenBucket, Limit: 3, Period: time.Minute},
		{Algorithm: floodgate.TokenBucket, Limit: 3, Period: time.Minute, Refill: floodgate.RefillInterval},
		{Algorithm: floodgate.LeakyBucketShaper, Limit: 3, Period: time.Minute},
		{Algorithm: floodgate.FixedWindow, Limit: 3, Period: time.Minute},
		{Algorithm: floodgate.FixedWindow, Limit: 3, Calendar: floodgate.CalendarDay},
		{Algorithm: floodgate.SlidingLog, Limit: 3, Period: time.Minute},
		{Algorithm: floodgate.SlidingWindow, Limit: 3, Period: time.Minute},
		{Algorithm: floodgate.SlidingSubwindow, Limit: 3, Period: time.Minute, Granularity: time.Second},
	} {
		p := floodgate.MustPolicy("smoke-"+string(r.Algorithm)+string(r.Refill)+string(r.Calendar), r)
		mem := make([]int64, p.Width())
		now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
		for i := range 6 {
			now += int64(i) * 7_000_000
			op := floodgate.Op{Policy: p, Key: "k", Kind: floodgate.OpAllow, Cost: 1}
			want := p.Apply(mem, now, op)
			got, err := s.Do(ctx, now, op)
			if err != nil || got != want {
				t.Errorf("%s step %d:\n got %+v %v\nwant %+v", p.Name(), i, got, err, want)
			}
		}
	}
}
