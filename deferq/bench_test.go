package deferq_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/floodgate/floodgate/deferq"
	"github.com/floodgate/floodgate/internal/redistest"
)

// BenchmarkEnqueue: one request (a 256-byte body, a few headers) onto the
// queue: the bounded XADD script, over loopback to a real redis-server.
// BenchmarkRedisSet is the peer: one SET of the same size, same server.
func BenchmarkEnqueue(b *testing.B) {
	srv := redistest.Standalone(b)
	q := newQueue(b, srv.Addr, deferq.Options{MaxLen: 1 << 40})
	body := strings.Repeat("x", 256)
	b.ReportAllocs()
	for b.Loop() {
		r := httptest.NewRequest(http.MethodPost, "/orders?id=7", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Authorization", "Bearer abc")
		if _, err := q.Enqueue(context.Background(), r); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRedisSet(b *testing.B) {
	srv := redistest.Standalone(b)
	c := client(b, srv.Addr)
	v := strings.Repeat("x", 400)
	for b.Loop() {
		if err := c.Do(context.Background(), c.B().Set().Key("k").Value(v).Build()).Error(); err != nil {
			b.Fatal(err)
		}
	}
}
