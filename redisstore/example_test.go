package redisstore_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/redisstore"
)

// One limit for a fleet: every process that points its limiter at the
// same Redis shares each key's count. When Redis cannot answer within the
// store's timeout, each rule's OnStoreFailure decides; here every
// instance then enforces a quarter of the limit on its own (four
// instances). This example needs a Redis server, so it is compiled, not
// run.
func Example() {
	store, err := redisstore.New("redis://redis.internal:6379/0", redisstore.Options{Timeout: 20 * time.Millisecond})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()

	policy := floodgate.MustPolicy("api", floodgate.Rule{
		Algorithm: floodgate.SlidingWindow, Limit: 1000, Period: time.Minute,
		OnStoreFailure: floodgate.FailLocal, LocalPercent: 25,
	})
	limiter := floodgate.NewLimiter(policy, store)

	d, err := limiter.Allow(context.Background(), "user:241531")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(d.Allowed, d.Remaining, d.Degraded)
}

// A Redis Cluster (or Sentinel: redis-sentinel://host:26379/mymaster)
// is named by its URL; the store follows failovers and, in a Cluster,
// keeps a breaker per group of hash slots. Stats feed metrics and health
// checks. Compiled, not run.
func ExampleStore_Stats() {
	store, err := redisstore.New("redis-cluster://10.0.0.1:7000,10.0.0.2:7000,10.0.0.3:7000", redisstore.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()

	if err := store.Ping(context.Background()); err != nil {
		log.Print("redis: ", err)
	}
	st := store.Stats()
	fmt.Printf("calls=%d errors=%d degraded=%d breaker-open=%v\n", st.Calls, st.Errors, st.Degraded, st.Breaker)
}

// ParseURL reads a store URL without connecting, to build a rueidis
// client of one's own (for NewWithClient, say).
func ExampleParseURL() {
	opt, err := redisstore.ParseURL("redis-sentinel://:secret@10.0.0.1:26379,10.0.0.2:26379/mymaster?db=2")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(opt.InitAddress, opt.Sentinel.MasterSet, opt.SelectDB)
	// Output: [10.0.0.1:26379 10.0.0.2:26379] mymaster 2
}
