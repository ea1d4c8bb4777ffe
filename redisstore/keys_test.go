package redisstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/redistest"
	"github.com/floodgate/floodgate/redisstore"
)

// The empty key gets a hash tag of its own ({%}: an empty {} is none, and
// a Move of it on a Cluster had two slots and panicked in the client), a
// key over MaxKeyBytes its digest; neither meets an escaped key.
func TestKeyForms(t *testing.T) {
	s, err := redisstore.New("redis://127.0.0.1:1", redisstore.Options{}) // never dialled here
	if err != nil {
		t.Skip(err)
	}
	defer s.Close()
	long := strings.Repeat("k", redisstore.MaxKeyBytes+1)
	for key, want := range map[string]string{
		"":                 "floodgate:1:{%}:p",
		"%":                "floodgate:1:{%25}:p",
		"{a}%":             "floodgate:1:{%7Ba%7D%25}:p",
		long:               "floodgate:1:{%s",
		long[:len(long)-1]: "floodgate:1:{" + long[:len(long)-1] + "}:p",
		"%s" + long[:10]:   "floodgate:1:{%25s" + long[:10] + "}:p",
	} {
		if got := s.Key("p", key); !strings.HasPrefix(got, want) {
			t.Errorf("Key(%.20q…): %.40q, want %.40q", key, got, want)
		}
	}
	if got := s.Key("p", long); len(got) != len("floodgate:1:{%s}:p")+64 {
		t.Errorf("a long key's Redis key is %d bytes, want its digest's", len(got))
	}
	if s.Key("p", long) == s.Key("p", long+"x") {
		t.Error("two long keys meet")
	}
}

// On a Cluster, the empty key is moved like any other.
func TestClusterMoveEmptyKey(t *testing.T) {
	c := redistest.Cluster(t, 3)
	s, err := redisstore.New("redis-cluster://"+strings.Join(c.Addrs(), ","), redisstore.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	from := floodgate.MustPolicy("from", floodgate.Rule{Name: "r", Algorithm: floodgate.FixedWindow, Limit: 10, Period: time.Hour})
	to := floodgate.MustPolicy("to", floodgate.Rule{Name: "r", Algorithm: floodgate.FixedWindow, Limit: 20, Period: time.Hour})
	if _, err := floodgate.NewLimiter(from, s).AllowN(ctx, "", 3); err != nil {
		t.Fatal(err)
	}
	if err := s.Move(ctx, 0, from, to, ""); err != nil {
		t.Fatal(err)
	}
	if d, err := floodgate.NewLimiter(to, s).PeekN(ctx, "", 0); err != nil || d.Remaining != 17 {
		t.Fatalf("the empty key after the move: %+v, %v; want 17 of 20 left", d, err)
	}
}

// Keys of megabytes are decided, and counted, as any other: sent whole,
// each took longer than the store's timeout, and three such calls opened
// the breaker for every key.
func TestHugeKeysAreDecided(t *testing.T) {
	srv := redistest.Standalone(t)
	// The default timeout (50 ms) is the subject: plus a multiple of how
	// late this host wakes goroutines, which a starved one made more than
	// the whole call.
	starved := redistest.WatchStarvation(t)
	s, err := redisstore.New("redis://"+srv.Addr, redisstore.Options{Timeout: starved.Allow(50*time.Millisecond, 3)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	l := floodgate.NewLimiter(floodgate.MustPolicy("huge", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 1, Period: time.Hour}), s)
	// the first call loads the function library, which a starved host may
	// take longer than the timeout to do
	eventuallyStarved(t, starved, 3*time.Second, 10, "a decision on Redis", func() bool {
		d, err := l.Allow(ctx, "warm")
		return err == nil && !d.Degraded
	})
	huge := strings.Repeat("k", 8<<20)
	for i := range 4 {
		d, err := l.Allow(ctx, huge)
		if err != nil || d.Degraded || d.Allowed != (i == 0) {
			t.Fatalf("request %d with an 8 MB key: %+v, %v; want only the first admitted, none degraded", i, d, err)
		}
	}
	if d, err := l.Allow(ctx, huge[1:]); err != nil || !d.Allowed {
		t.Fatalf("another huge key: %+v, %v; want admitted", d, err)
	}
}
