package service_test

import (
	"context"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/gcfloor"
	"github.com/floodgate/floodgate/internal/redistest"
	"github.com/floodgate/floodgate/memstore"
	"github.com/floodgate/floodgate/overrides"
	"github.com/floodgate/floodgate/redisstore"
	"github.com/floodgate/floodgate/rules"
	"github.com/floodgate/floodgate/service"
)

// The service's own benchmarks, set up as `floodgate serve` is: metrics, an
// overrides cache over bbolt, the bench script's rule (generic_key, a huge
// per-second limit) over 1,000 keys.
//
//	go test -run '^$' -bench . -benchmem ./service
//	go test -run '^$' -bench 'Decide/memory' -cpuprofile cpu.out -memprofile mem.out ./service

const benchRules = `domain: bench
descriptors:
  - key: generic_key
    rate_limit:
      unit: second
      requests_per_unit: 1000000000
`

func benchService(b *testing.B, store floodgate.Store) *service.Service {
	b.Helper()
	return benchServiceWith(b, store, nil, false)
}

// benchServiceWith is benchService tracing to tp (nil: off), and
// recording decisions for the dashboard when record is set.
func benchServiceWith(b *testing.B, store floodgate.Store, tp trace.TracerProvider, record bool) *service.Service {
	b.Helper()
	d, err := rules.Parse("bench.yaml", []byte(benchRules))
	if err != nil {
		b.Fatal(err)
	}
	cfg, err := rules.NewConfig(d)
	if err != nil {
		b.Fatal(err)
	}
	bolt, err := overrides.OpenBolt(filepath.Join(b.TempDir(), "o.db"))
	if err != nil {
		b.Fatal(err)
	}
	cache := overrides.NewCache(bolt, 1<<16, 0)
	b.Cleanup(func() { cache.Close() })
	return service.New(cfg, service.Options{Store: store, Overrides: cache, OverrideTimeout: 50 * time.Millisecond, Metrics: service.NewMetrics(),
		TracerProvider: tp, RecordDecisions: record})
}

func benchStore(b *testing.B, kind string) floodgate.Store {
	b.Helper()
	switch kind {
	case "memory":
		st := memstore.MustNew(memstore.Options{})
		b.Cleanup(func() { st.Close() })
		return st
	case "redis":
		redistest.Require(b)
		srv := redistest.Standalone(b)
		st, err := redisstore.New("redis://"+srv.Addr, redisstore.Options{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { st.Close() })
		return st
	}
	b.Fatalf("store %q", kind)
	return nil
}

func benchRequests() []*rlsv3.RateLimitRequest {
	reqs := make([]*rlsv3.RateLimitRequest, 1000)
	for i := range reqs {
		reqs[i] = &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*rlcommon.RateLimitDescriptor{
			{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "generic_key", Value: "k" + strconv.Itoa(i)}}}}}
	}
	return reqs
}

// BenchmarkDecide is one decision through ShouldRateLimit, without gRPC,
// from 64 goroutines (as the bench script's closed loop).
func BenchmarkDecide(b *testing.B) {
	for _, kind := range []string{"memory", "redis"} {
		b.Run(kind, func(b *testing.B) {
			svc := benchService(b, benchStore(b, kind))
			reqs := benchRequests()
			ctx := context.Background()
			for _, r := range reqs { // the keys and their overrides' absence cached
				if _, err := svc.ShouldRateLimit(ctx, r); err != nil {
					b.Fatal(err)
				}
			}
			decideParallel(b, ctx, svc, reqs)
		})
	}
}

// BenchmarkDashboard is BenchmarkDecide on the memory store with the
// dashboard's recorder off, on, and on with a dashboard open (sampled and
// read, with the top keys, every 100ms: 20 times the page's rate). Run the
// three interleaved, several rounds (docs/BENCHMARKS.md):
//
//	go test -run '^$' -bench 'Dashboard' -benchtime 2s -count 3 ./service
func BenchmarkDashboard(b *testing.B) {
	for _, mode := range []string{"off", "on", "open"} {
		b.Run(mode, func(b *testing.B) {
			svc := benchServiceWith(b, benchStore(b, "memory"), nil, mode != "off")
			reqs := benchRequests()
			ctx := context.Background()
			for _, r := range reqs {
				if _, err := svc.ShouldRateLimit(ctx, r); err != nil {
					b.Fatal(err)
				}
			}
			done := make(chan struct{})
			var wg sync.WaitGroup
			if mode == "open" {
				wg.Go(func() {
					t := time.NewTicker(100 * time.Millisecond)
					defer t.Stop()
					var since int64
					for sec := int64(1); ; sec++ {
						select {
						case <-done:
							return
						case <-t.C:
						}
						svc.Recorder().Sample(sec)
						_, _, since = svc.Recorder().Since(since)
						svc.TopLimited("", "", 10)
					}
				})
			}
			decideParallel(b, ctx, svc, reqs)
			close(done)
			wg.Wait()
		})
	}
}

// BenchmarkMarshalResponse is what gRPC pays to encode a decision.
func BenchmarkMarshalResponse(b *testing.B) {
	svc := benchService(b, benchStore(b, "memory"))
	resp, err := svc.ShouldRateLimit(context.Background(), benchRequests()[0])
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := proto.Marshal(resp); err != nil {
			b.Fatal(err)
		}
	}
}

type emptyRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

var okResp = &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}

func (emptyRLS) ShouldRateLimit(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return okResp, nil
}

// BenchmarkGRPC is ShouldRateLimit over loopback gRPC, 64 callers on one
// connection, on the empty handler and on the service: cpu-ns/op is the
// whole process's CPU (client and server) per call.
func BenchmarkGRPC(b *testing.B) {
	if os.Getenv("BENCH_GCFLOOR") != "" {
		gcfloor.Set(gcfloor.Default)
	}
	for _, kind := range []string{"empty", "memory", "redis"} {
		b.Run(kind, func(b *testing.B) {
			var h rlsv3.RateLimitServiceServer = emptyRLS{}
			if kind != "empty" {
				h = benchService(b, benchStore(b, kind))
			}
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			opts := service.GRPCOptions()
			if n, err := strconv.Atoi(os.Getenv("BENCH_WORKERS")); err == nil {
				opts = append(opts, grpc.NumStreamWorkers(uint32(n)))
			}
			gs := grpc.NewServer(opts...)
			rlsv3.RegisterRateLimitServiceServer(gs, h)
			go gs.Serve(lis)
			b.Cleanup(gs.Stop)
			cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { cc.Close() })
			client := rlsv3.NewRateLimitServiceClient(cc)
			reqs := benchRequests()
			for _, r := range reqs {
				if _, err := client.ShouldRateLimit(context.Background(), r); err != nil {
					b.Fatal(err)
				}
			}
			var next atomic.Uint64
			b.ReportAllocs()
			b.SetParallelism(32)
			cpu0 := processCPU()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := next.Add(7919)
				for pb.Next() {
					i++
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					_, err := client.ShouldRateLimit(ctx, reqs[i%uint64(len(reqs))])
					cancel()
					if err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkTracing is one decision through ShouldRateLimit on the memory
// store, from one goroutine, with tracing off (no TracerProvider), on
// but sampled out, and on with every decision recorded by the SDK (no
// exporter: the instrumentation's own cost).
//
//	go test -run '^$' -bench 'Tracing' -benchmem ./service
func BenchmarkTracing(b *testing.B) {
	for _, c := range []struct {
		name string
		tp   trace.TracerProvider
	}{
		{"off", nil},
		{"unsampled", sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))},
		{"sampled", sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))},
	} {
		b.Run(c.name, func(b *testing.B) {
			svc := benchServiceWith(b, benchStore(b, "memory"), c.tp, false)
			reqs := benchRequests()
			ctx := context.Background()
			for _, r := range reqs {
				if _, err := svc.ShouldRateLimit(ctx, r); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				if _, err := svc.ShouldRateLimit(ctx, reqs[i%len(reqs)]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDecideRecord is BenchmarkDecide/memory with the what-if
// recorder off (the default of service.New) and on (serve's default: five
// minutes, capped at DefaultRecordMaxEntries requests, which a benchmark
// reaches within a second: the steady state of a flood, each request
// dropping the oldest).
//
//	go test -c -o /tmp/svc.test ./service
//	for i in 1 2 3; do /tmp/svc.test -test.run '^$' -test.bench 'DecideRecord' -test.benchmem -test.benchtime 1000000x; done
func BenchmarkDecideRecord(b *testing.B) {
	for _, mode := range []string{"off", "on"} {
		b.Run(mode, func(b *testing.B) {
			d, err := rules.Parse("bench.yaml", []byte(benchRules))
			if err != nil {
				b.Fatal(err)
			}
			cfg, err := rules.NewConfig(d)
			if err != nil {
				b.Fatal(err)
			}
			opts := service.Options{Store: benchStore(b, "memory"), Metrics: service.NewMetrics()}
			if mode == "on" {
				opts.Record = service.RecordOptions{Window: service.DefaultRecordWindow}
			}
			svc := service.New(cfg, opts)
			reqs := benchRequests()
			ctx := context.Background()
			for range service.DefaultRecordMaxEntries / len(reqs) { // the recorder full
				for _, r := range reqs {
					if _, err := svc.ShouldRateLimit(ctx, r); err != nil {
						b.Fatal(err)
					}
				}
			}
			decideParallel(b, ctx, svc, reqs)
		})
	}
}

// BenchmarkWhatIf is one POST /v1/whatif over a full recorder
// (DefaultRecordMaxEntries requests of 1,000 keys): both replays, the
// posted rules' and the live ones'.
//
//	go test -run '^$' -bench 'WhatIf' -benchtime 5x ./service
func BenchmarkWhatIf(b *testing.B) {
	d, err := rules.Parse("bench.yaml", []byte(benchRules))
	if err != nil {
		b.Fatal(err)
	}
	cfg, err := rules.NewConfig(d)
	if err != nil {
		b.Fatal(err)
	}
	svc := service.New(cfg, service.Options{Store: benchStore(b, "memory"), Record: service.RecordOptions{Window: service.MaxRecordWindow}, AdminTimeout: time.Minute})
	ctx := context.Background()
	reqs := benchRequests()
	for range service.DefaultRecordMaxEntries / len(reqs) {
		for _, r := range reqs {
			if _, err := svc.ShouldRateLimit(ctx, r); err != nil {
				b.Fatal(err)
			}
		}
	}
	h := svc.AdminHandler("")
	cand := strings.Replace(benchRules, "1000000000", "100", 1)
	for b.Loop() {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("POST", "/v1/whatif", strings.NewReader(cand)))
		if w.Code != 200 || !strings.Contains(w.Body.String(), `"complete": true`) {
			b.Fatalf("%d %s", w.Code, w.Body.String()[:min(w.Body.Len(), 500)])
		}
	}
	b.ReportMetric(float64(service.DefaultRecordMaxEntries), "requests/op")
}

// decideParallel times svc's decisions of reqs from 32 goroutines a CPU,
// each starting at its own place in reqs, and reports the process's CPU
// per decision (cpu-ns/op) beside the wall time.
func decideParallel(b *testing.B, ctx context.Context, svc *service.Service, reqs []*rlsv3.RateLimitRequest) {
	b.Helper()
	var next atomic.Uint64
	b.ReportAllocs()
	b.SetParallelism(32)
	cpu0 := processCPU()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := next.Add(7919)
		for pb.Next() {
			i++
			if _, err := svc.ShouldRateLimit(ctx, reqs[i%uint64(len(reqs))]); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
}
