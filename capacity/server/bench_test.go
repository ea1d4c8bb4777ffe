package server

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	pb "github.com/floodgate/floodgate/capacity/capacitypb"
	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/internal/lease"
)

// BenchmarkGetCapacityHandler is the server's own cost of one GetCapacity
// (validation, the table's grant, the response), without the network:
// 10,000 clients refreshing their leases in parallel.
func BenchmarkGetCapacityHandler(b *testing.B) {
	s := New(config(resource("db", 1e6, lease.FairShare)), Options{Clock: clock.Coarse})
	const n = 10000
	reqs := make([]*pb.GetCapacityRequest, n)
	for i := range reqs {
		reqs[i] = &pb.GetCapacityRequest{ClientId: fmt.Sprint("client-", i),
			Resource: []*pb.ResourceRequest{{ResourceId: "db", Wants: float64(1 + i%200)}}}
		if _, err := s.GetCapacity(context.Background(), reqs[i]); err != nil {
			b.Fatal(err)
		}
	}
	var next atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := s.GetCapacity(context.Background(), reqs[next.Add(1)%n]); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
