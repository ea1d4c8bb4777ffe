package server_test

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/floodgate/floodgate/capacity/server"
	"github.com/floodgate/floodgate/clock"
	"github.com/floodgate/floodgate/internal/lease"
)

// benchServer serves RLQS on loopback with the real (coarse) clock: every
// bucket of domain "bench" is its own resource of the "*" default.
func benchServer(b *testing.B) (*grpc.ClientConn, *lease.Table) {
	b.Helper()
	cfg := &lease.Config{Resources: []lease.Resource{{
		ID: "*", Capacity: 1000, Algorithm: lease.FairShare,
		LeaseLength: 60 * time.Second, RefreshInterval: 5 * time.Second, LearningMode: 60 * time.Second,
	}}}
	srv := server.New(cfg, server.Options{Clock: clock.Coarse, MaxClients: 1 << 20})
	gs := grpc.NewServer()
	r := server.RegisterRLQS(gs, srv, server.RLQSOptions{MaxStreams: 1 << 16})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go gs.Serve(lis)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		conn.Close()
		gs.Stop()
		r.Close()
	})
	return conn, srv.Table()
}

// benchReport is a report of n buckets {name: bN} (shared by every
// stream: the Envoys share the buckets' quotas).
func benchReport(n int) *rlqspb.RateLimitQuotaUsageReports {
	m := &rlqspb.RateLimitQuotaUsageReports{Domain: "bench"}
	for i := 0; i < n; i++ {
		m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId:           &rlqspb.BucketId{Bucket: map[string]string{"name": fmt.Sprintf("b%d", i)}},
			TimeElapsed:        durationpb.New(time.Second),
			NumRequestsAllowed: uint64(10 + i), NumRequestsDenied: 3,
		})
	}
	return m
}

// BenchmarkRLQSReports: Envoys (one stream per parallel goroutine,
// -cpu × 8 of them) sending usage reports of 1 or 10 buckets, each
// answered with its assignments before the next; an op is one report
// answered. reports/s and buckets/s are the server's throughput.
func BenchmarkRLQSReports(b *testing.B) {
	for _, buckets := range []int{1, 10} {
		b.Run(fmt.Sprintf("buckets=%d", buckets), func(b *testing.B) {
			conn, _ := benchServer(b)
			client := rlqspb.NewRateLimitQuotaServiceClient(conn)
			m := benchReport(buckets)
			var failed atomic.Value
			b.SetParallelism(8)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				stream, err := client.StreamRateLimitQuotas(ctx)
				if err != nil {
					failed.Store(err)
					return
				}
				for pb.Next() {
					if err := stream.Send(m); err != nil {
						failed.Store(err)
						return
					}
					if _, err := stream.Recv(); err != nil {
						failed.Store(err)
						return
					}
				}
			})
			if err := failed.Load(); err != nil {
				b.Fatal(err)
			}
			s := b.Elapsed().Seconds()
			b.ReportMetric(float64(b.N)/s, "reports/s")
			b.ReportMetric(float64(b.N*buckets)/s, "buckets/s")
		})
	}
}

// BenchmarkRLQSStreams: an op is an Envoy's whole life: open a stream,
// subscribe one bucket, get its assignment, close (the server releases
// the lease). streams/s is how many Envoys come and go per second.
func BenchmarkRLQSStreams(b *testing.B) {
	conn, _ := benchServer(b)
	client := rlqspb.NewRateLimitQuotaServiceClient(conn)
	m := benchReport(1)
	var failed atomic.Value
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			ctx, cancel := context.WithCancel(context.Background())
			stream, err := client.StreamRateLimitQuotas(ctx)
			if err == nil {
				err = stream.Send(m)
			}
			if err == nil {
				_, err = stream.Recv()
			}
			cancel()
			if err != nil {
				failed.Store(err)
				return
			}
		}
	})
	if err := failed.Load(); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "streams/s")
}

// BenchmarkRLQSTableOnly is the peer: the same grants as
// BenchmarkRLQSReports/buckets=10 (one Table.Get of 10 resources per op,
// a client per goroutine) without gRPC, the ceiling the service runs
// against.
func BenchmarkRLQSTableOnly(b *testing.B) {
	cfg := &lease.Config{Resources: []lease.Resource{{
		ID: "*", Capacity: 1000, Algorithm: lease.FairShare,
		LeaseLength: 60 * time.Second, RefreshInterval: 5 * time.Second, LearningMode: 60 * time.Second,
	}}}
	table := lease.New(cfg, lease.Options{Clock: clock.Coarse, MaxClients: 1 << 20})
	var seq atomic.Int64
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		client := fmt.Sprintf("c%d", seq.Add(1))
		reqs := make([]lease.Request, 10)
		for i := range reqs {
			reqs[i] = lease.Request{Resource: server.BucketResource("bench", map[string]string{"name": fmt.Sprintf("b%d", i)}), Wants: float64(13 + i)}
		}
		var out []lease.Lease
		for pb.Next() {
			var err error
			if out, err = table.Get(client, reqs, out); err != nil {
				b.Error(err)
				return
			}
			for i := range reqs {
				reqs[i].Has = out[i]
			}
		}
	})
	b.ReportMetric(float64(b.N*10)/b.Elapsed().Seconds(), "buckets/s")
}
