package overrides_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/overrides"
	"github.com/floodgate/floodgate/redisstore"
)

// One customer gets more than the rule gives everyone: the override is
// kept in a Bolt file, looked up through a cache on the hot path, and
// applied to the rule the request matched.
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "overrides-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	db, err := overrides.OpenBolt(filepath.Join(dir, "overrides.db"))
	if err != nil {
		panic(err)
	}
	// Every write goes through the cache, so it needs no TTL.
	store := overrides.NewCache(db, 10_000, 0)
	defer store.Close() // closes db too

	err = store.Put(ctx, overrides.Override{
		Domain: "api", Key: "user_id=241531",
		Limit: 500, Period: time.Minute, Note: "enterprise plan",
	})
	if err != nil {
		panic(err)
	}

	rule := floodgate.Rule{Name: "minute", Algorithm: floodgate.SlidingWindow, Limit: 100, Period: time.Minute}
	for _, key := range []string{"user_id=241531", "user_id=7"} {
		if o, ok, err := store.Get(ctx, "api", key); err == nil && ok {
			rule := o.Apply(rule)
			fmt.Printf("%s: %d per %s (%s)\n", key, rule.Limit, rule.Period, o.Note)
		} else {
			fmt.Printf("%s: %d per %s (the rule's)\n", key, rule.Limit, rule.Period)
		}
	}
	// Output:
	// user_id=241531: 500 per 1m0s (enterprise plan)
	// user_id=7: 100 per 1m0s (the rule's)
}

// Validate names the first bad field, as the admin API reports it.
func ExampleOverride_Validate() {
	o := overrides.Override{Domain: "api", Key: "user_id=7", Limit: 0, Period: time.Second}
	fmt.Println(o.Validate())
	// Output: override "api"/"user_id=7": limit: must be positive, got 0
}

// On Redis every instance of the service sees the same overrides, and
// the cache hears of other instances' writes on the store's change
// channel. The overrides share the rate-limit store's Redis client. (This
// example needs a Redis server, so it is compiled, not run.)
func ExampleNewRedis() {
	limits, err := redisstore.New("redis://redis.internal:6379", redisstore.Options{})
	if err != nil {
		panic(err)
	}
	defer limits.Close()
	store := overrides.NewCache(overrides.NewRedis(limits.Client(), "floodgate-overrides"), 100_000, time.Minute)
	defer store.Close()

	o, ok, err := store.Get(context.Background(), "api", "user_id=241531")
	if err == nil && ok {
		fmt.Println(o.Limit, o.Period)
	}
}
