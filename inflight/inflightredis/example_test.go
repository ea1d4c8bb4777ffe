package inflightredis_test

import (
	"context"
	"time"

	"github.com/redis/rueidis"

	"github.com/floodgate/floodgate/inflight/inflightredis"
)

// At most 20 requests in flight per tenant across every process sharing
// the Redis; a dead process's slots come back within 10 s.
func ExampleNew() {
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{"127.0.0.1:6379"}})
	if err != nil {
		return // no Redis here
	}
	defer c.Close()
	l, err := inflightredis.New(c, inflightredis.Options{Limit: 20, TTL: 10 * time.Second})
	if err != nil {
		panic(err)
	}
	defer l.Close()
	tok, ok, err := l.Acquire(context.Background(), "tenant-1")
	if err != nil || !ok {
		return // refuse: 429 (or fail open on err)
	}
	defer tok.Release()
	// ... serve the request ...
}
