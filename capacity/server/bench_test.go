package server

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	pb "github.com/floodgate/floodgate/capacity/capacitypb"
	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/internal/lease"
)

// BenchmarkGetCapacityHandler is the server's own cost of one GetCapacity
// (validation, the table's grant, the response), without the network:
// clients refreshing their leases in parallel, each reporting the lease it
// holds, as the client library does.
func BenchmarkGetCapacityHandler(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprint("clients=", n), func(b *testing.B) { benchHandler(b, n) })
	}
}

func benchHandler(b *testing.B, n int) {
	s := New(config(resource("db", 1e6, lease.FairShare)), Options{Clock: clock.Coarse})
	reqs := make([]*pb.GetCapacityRequest, n)
	mus := make([]sync.Mutex, n)
	for i := range reqs {
		reqs[i] = &pb.GetCapacityRequest{ClientId: fmt.Sprint("client-", i),
			Resource: []*pb.ResourceRequest{{ResourceId: "db", Wants: float64(1 + i%200)}}}
		resp, err := s.GetCapacity(context.Background(), reqs[i])
		if err != nil {
			b.Fatal(err)
		}
		reqs[i].Resource[0].Has = resp.Response[0].Gets
	}
	var next atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := int(next.Add(1) % int64(n))
			mus[i].Lock()
			resp, err := s.GetCapacity(context.Background(), reqs[i])
			if err != nil {
				mus[i].Unlock()
				b.Error(err)
				return
			}
			reqs[i].Resource[0].Has = resp.Response[0].Gets
			mus[i].Unlock()
		}
	})
}
