package server_test

import (
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/floodgate/floodgate/capacity/server"
	"github.com/floodgate/floodgate/internal/lease"
)

const apiResource = "envoy/name=api" // BucketResource("envoy", {name: api})

// config is a configuration of the given entries and a "*" default of
// capacity 5.
func config(entries ...lease.Resource) *lease.Config {
	return &lease.Config{Resources: append(entries, resource("*", 5, lease.FairShare))}
}

// checkSplit fails the test if the Envoys' assignments for bucket name,
// or the Table's leases of resource, add up to more than capacity.
func checkSplit(t *testing.T, h *rlqsHarness, envoys []*envoy, name, resource string, capacity float64, when string) float64 {
	t.Helper()
	sum := 0.0
	for _, e := range envoys {
		sum += e.rate(name)
	}
	if sum > capacity {
		t.Fatalf("%s: the Envoys' assignments add up to %v, over the quota %v", when, sum, capacity)
	}
	if out := h.table.Outstanding(resource); out > capacity+1e-9 {
		t.Fatalf("%s: the Table's outstanding leases add up to %v, over the quota %v", when, out, capacity)
	}
	return sum
}

// rates returns each Envoy's assigned rate for bucket name.
func rates(envoys []*envoy, name string) []float64 {
	out := make([]float64, len(envoys))
	for i, e := range envoys {
		out[i] = e.rate(name)
	}
	return out
}

// runRounds advances the clock a second per round and has every Envoy
// report, checking the split after each answer; it returns the round at
// which every rate equals want (-1 if none did).
func runRounds(t *testing.T, h *rlqsHarness, envoys []*envoy, capacity float64, rounds int, want []float64) int {
	t.Helper()
	for round := 1; round <= rounds; round++ {
		h.clock.Advance(time.Second)
		for i, e := range envoys {
			e.report(time.Second)
			checkSplit(t, h, envoys, "api", apiResource, capacity, fmt.Sprintf("round %d, Envoy %d", round, i))
		}
		if equal(rates(envoys, "api"), want) {
			return round
		}
	}
	return -1
}

func equal(a, b []float64) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Envoys of unequal demand share a bucket's quota by the resource's
// algorithm (Doorman's worked example: capacity 120, demands 1000, 50 and
// 10), the assignments never adding up to more than the quota at any
// answer, and at the end to the quota less at most one request per second
// per Envoy (token buckets hold whole tokens; rounding is always down).
func TestRLQSSplitsQuotaByDemand(t *testing.T) {
	for _, tc := range []struct {
		alg  lease.Algorithm
		want []float64
	}{
		{lease.FairShare, []float64{60, 50, 10}},
		{lease.ProportionalShare, []float64{69, 40, 10}}, // 69.69, 40.31, 10 rounded down
	} {
		t.Run(string(tc.alg), func(t *testing.T) {
			h := startRLQS(t, config(resource(apiResource, 120, tc.alg)), server.RLQSOptions{})
			var envoys []*envoy
			for _, d := range []float64{1000, 50, 10} {
				e := h.newEnvoy("envoy")
				e.subscribe("api", d)
				envoys = append(envoys, e)
				checkSplit(t, h, envoys, "api", apiResource, 120, "subscribing")
			}
			round := runRounds(t, h, envoys, 120, 10, tc.want)
			got := rates(envoys, "api")
			if round < 0 {
				t.Fatalf("after 10 reporting intervals the rates are %v, want %v", got, tc.want)
			}
			sum := checkSplit(t, h, envoys, "api", apiResource, 120, "the end")
			if sum < 120-float64(len(envoys)) {
				t.Fatalf("the assignments add up to %v, want the quota 120 less the rounding (at most 3)", sum)
			}
			if out := h.table.Outstanding(apiResource); math.Abs(out-120) > 1e-6 {
				t.Fatalf("the Table's leases add up to %v, want the whole quota 120", out)
			}
			t.Logf("%s: %v after %d reporting intervals", tc.alg, got, round)
		})
	}
}

// A demand shift re-splits the quota within a few reporting intervals,
// never over the quota on the way.
func TestRLQSDemandShiftResplits(t *testing.T) {
	h := startRLQS(t, config(resource(apiResource, 100, lease.FairShare)), server.RLQSOptions{})
	a, b := h.newEnvoy("envoy"), h.newEnvoy("envoy")
	a.subscribe("api", 200)
	b.subscribe("api", 20)
	envoys := []*envoy{a, b}
	if r := runRounds(t, h, envoys, 100, 10, []float64{80, 20}); r < 0 {
		t.Fatalf("before the shift: rates %v, want [80 20]", rates(envoys, "api"))
	}
	a.buckets["api"].demand, b.buckets["api"].demand = 20, 200
	r := runRounds(t, h, envoys, 100, 10, []float64{20, 80})
	if r < 0 {
		t.Fatalf("after the shift: rates %v, want [20 80] within 10 reporting intervals", rates(envoys, "api"))
	}
	t.Logf("re-split in %d reporting intervals", r)
}

// A stream that ends frees its share: the Table releases its leases at
// once, and the remaining Envoy gets the whole quota at its next report.
func TestRLQSStreamEndFreesShare(t *testing.T) {
	h := startRLQS(t, config(resource(apiResource, 100, lease.FairShare)), server.RLQSOptions{})
	a, b := h.newEnvoy("envoy"), h.newEnvoy("envoy")
	a.subscribe("api", 500)
	b.subscribe("api", 500)
	envoys := []*envoy{a, b}
	if r := runRounds(t, h, envoys, 100, 10, []float64{50, 50}); r < 0 {
		t.Fatalf("rates %v, want [50 50]", rates(envoys, "api"))
	}
	b.close()
	waitFor(t, "the ended stream's release", func() bool { return h.rlqs.Streams() == 1 })
	if out := h.table.Outstanding(apiResource); out > 50+1e-9 {
		t.Fatalf("after the stream ended the Table still counts %v outstanding, want at most the other's 50", out)
	}
	h.clock.Advance(time.Second)
	a.report(time.Second)
	h.clock.Advance(time.Second)
	a.report(time.Second)
	if got := a.rate("api"); got != 100 {
		t.Fatalf("the remaining Envoy's rate is %v, want the whole quota 100", got)
	}
}

// A stream cut without the Envoy's half-close (a crash, a reset, a
// partition: its context cancelled here) does not free its share at once:
// the Envoy may still be enforcing its assignment until its TTL, so its
// lease stays counted until it expires, and the other Envoy gets the room
// only then.
func TestRLQSStreamCutKeepsShareUntilExpiry(t *testing.T) {
	h := startRLQS(t, config(resource(apiResource, 100, lease.FairShare)), server.RLQSOptions{})
	a, b := h.newEnvoy("envoy"), h.newEnvoy("envoy")
	a.subscribe("api", 500)
	b.subscribe("api", 500)
	envoys := []*envoy{a, b}
	if r := runRounds(t, h, envoys, 100, 10, []float64{50, 50}); r < 0 {
		t.Fatalf("rates %v, want [50 50]", rates(envoys, "api"))
	}
	cutAt := h.clock.Now()
	b.cancel()
	waitFor(t, "the cut stream's end", func() bool { return h.rlqs.Streams() == 1 })
	bHeld, bUntil := b.rate("api"), b.buckets["api"].expires
	for h.clock.Now().Before(bUntil) {
		h.clock.Advance(5 * time.Second)
		a.report(time.Second)
		if h.clock.Now().Before(bUntil) && a.rate("api")+bHeld > 100 {
			t.Fatalf("%v after the cut: a has %v while the cut Envoy may still admit %v, over the quota 100",
				h.clock.Now().Sub(cutAt), a.rate("api"), bHeld)
		}
	}
	h.clock.Advance(5 * time.Second)
	a.report(time.Second)
	a.report(time.Second)
	if got := a.rate("api"); got != 100 {
		t.Fatalf("after the cut stream's lease expired: rate %v, want the whole quota 100", got)
	}
}

// The assignment's TTL is the lease's remaining time less the margin, in
// whole seconds (Envoy reads only the seconds), so that Envoy's assignment
// never outlives the lease; the strategy is a token bucket.
func TestRLQSAssignmentTTL(t *testing.T) {
	h := startRLQS(t, config(resource(apiResource, 100, lease.FairShare)), server.RLQSOptions{})
	e := h.newEnvoy("envoy")
	r := e.subscribe("api", 10)
	if len(r.GetBucketAction()) != 1 {
		t.Fatalf("%d actions, want 1", len(r.GetBucketAction()))
	}
	qa := r.GetBucketAction()[0].GetQuotaAssignmentAction()
	if qa == nil || qa.GetRateLimitStrategy().GetTokenBucket() == nil {
		t.Fatalf("not a token-bucket assignment: %v", r)
	}
	if ttl := qa.GetAssignmentTimeToLive(); ttl.GetSeconds() != 59 || ttl.GetNanos() != 0 {
		t.Fatalf("TTL %v, want 59s (a 60s lease less the 0.5s margin, rounded down)", ttl.AsDuration())
	}
}

// A bucket the Envoy stops reporting is released when its lease length
// has passed since its last report (its assignment has expired by then),
// without a message; one it reports with no requests for IdleAfter is
// released and abandoned.
func TestRLQSExpiryAndIdleAbandon(t *testing.T) {
	h := startRLQS(t, config(resource(apiResource, 100, lease.FairShare), resource("envoy/name=idle", 100, lease.FairShare)),
		server.RLQSOptions{IdleAfter: 10 * time.Second})
	e := h.newEnvoy("envoy")
	e.subscribe("api", 10)
	e.subscribe("idle", 0)
	delete(e.buckets, "api") // the Envoy stops reporting it
	for i := 0; i < 9; i++ {
		h.clock.Advance(time.Second)
		e.report(time.Second)
	}
	h.rlqs.Sweep()
	if out := h.table.Outstanding("envoy/name=idle"); out == 0 {
		t.Fatal("the idle bucket was released before IdleAfter")
	}
	h.clock.Advance(time.Second)
	h.rlqs.Sweep()
	r := e.apply(e.recv())
	if len(r.GetBucketAction()) != 1 || r.GetBucketAction()[0].GetAbandonAction() == nil ||
		r.GetBucketAction()[0].GetBucketId().GetBucket()["name"] != "idle" {
		t.Fatalf("after 10s without requests: %v, want the idle bucket abandoned", r)
	}
	if out := h.table.Outstanding("envoy/name=idle"); out != 0 {
		t.Fatalf("the abandoned bucket still has %v outstanding", out)
	}
	// The unreported bucket: its 60s lease has not expired yet at 10s.
	if out := h.table.Outstanding(apiResource); out == 0 {
		t.Fatal("the unreported bucket was released before its lease length")
	}
	h.clock.Advance(50 * time.Second)
	h.rlqs.Sweep()
	if out := h.table.Outstanding(apiResource); out != 0 {
		t.Fatalf("60s after its last report the bucket still has %v outstanding", out)
	}
	select {
	case r := <-e.resps:
		t.Fatalf("a message for a bucket the Envoy stopped reporting: %v", r)
	default:
	}
}

// Removing a bucket's entry from the configuration abandons the bucket on
// every stream; its next subscription is served by the entry now matching
// (here the "*" default, capacity 5).
func TestRLQSAbandonOnConfigRemoval(t *testing.T) {
	cfg := config(resource(apiResource, 100, lease.FairShare), resource("envoy/name=kept", 100, lease.FairShare))
	h := startRLQS(t, cfg, server.RLQSOptions{})
	a, b := h.newEnvoy("envoy"), h.newEnvoy("envoy")
	a.subscribe("api", 200)
	a.subscribe("kept", 200)
	b.subscribe("api", 200)
	next := config(resource("envoy/name=kept", 80, lease.FairShare))
	h.srv.SetConfig(next)
	h.rlqs.Reload(next) // as floodgate serve calls it, from the Server's OnReload
	for _, e := range []*envoy{a, b} {
		r := e.apply(e.recv())
		var abandoned, kept bool
		for _, act := range r.GetBucketAction() {
			switch name := act.GetBucketId().GetBucket()["name"]; {
			case name == "api" && act.GetAbandonAction() != nil:
				abandoned = true
			case name == "kept" && act.GetQuotaAssignmentAction() != nil:
				kept = true
			}
		}
		if !abandoned || (e == a) != kept {
			t.Fatalf("after the reload: %v, want api abandoned (and kept re-granted on the stream holding it)", r)
		}
	}
	if out := h.table.Outstanding(apiResource); out != 0 {
		t.Fatalf("the removed entry's bucket still has %v outstanding", out)
	}
	r := a.subscribe("api", 200)
	if got := a.rate("api"); got > 5 {
		t.Fatalf("after re-subscribing: rate %v (%v), want at most the default's 5", got, r)
	}
	h.clock.Advance(time.Second)
	a.report(time.Second)
	if got := a.rate("kept"); got > 80 {
		t.Fatalf("the kept bucket's rate is %v, over its new capacity 80", got)
	}
}

// Several Envoys reporting at once from goroutines (run with -race): the
// Table's leases of the bucket never add up to more than the quota, and
// every stream gets an answer to every report.
func TestRLQSConcurrentEnvoys(t *testing.T) {
	h := startRLQS(t, config(resource(apiResource, 100, lease.ProportionalShare)), server.RLQSOptions{})
	const n, rounds = 8, 20
	envoys := make([]*envoy, n)
	for i := range envoys {
		envoys[i] = h.newEnvoy("envoy")
		envoys[i].subscribe("api", float64(10*(i+1)))
	}
	var wg sync.WaitGroup
	errs := make(chan string, n*rounds)
	for _, e := range envoys {
		wg.Add(1)
		go func(e *envoy) {
			defer wg.Done()
			for r := 0; r < rounds; r++ {
				e.sendReport(time.Second)
				select {
				case resp := <-e.resps:
					e.apply(resp)
				case err := <-e.errc:
					errs <- err.Error()
					return
				case <-time.After(10 * time.Second):
					errs <- "no answer in 10s"
					return
				}
				if out := h.table.Outstanding(apiResource); out > 100+1e-9 {
					errs <- fmt.Sprintf("outstanding %v, over the quota 100", out)
				}
			}
		}(e)
	}
	for r := 0; r < rounds; r++ {
		h.clock.Advance(500 * time.Millisecond)
		if out := h.table.Outstanding(apiResource); out > 100+1e-9 {
			t.Fatalf("outstanding %v, over the quota 100", out)
		}
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
}

// Several buckets in one stream, each its own resource; the "*" default
// serves a bucket no entry names.
func TestRLQSBucketsAreResources(t *testing.T) {
	h := startRLQS(t, config(resource(apiResource, 100, lease.FairShare)), server.RLQSOptions{})
	e := h.newEnvoy("envoy")
	e.subscribe("api", 500)
	e.subscribe("other", 500)
	h.clock.Advance(time.Second)
	e.report(time.Second)
	if got := e.rate("api"); got != 100 {
		t.Fatalf("api: rate %v, want 100", got)
	}
	if got := e.rate("other"); got != 5 {
		t.Fatalf("other: rate %v, want the default's 5", got)
	}
	if out := h.table.Outstanding("envoy/name=other"); out != 5 {
		t.Fatalf("the Table's lease of envoy/name=other: %v, want 5", out)
	}
}

// statusCode returns err's gRPC code.
func statusCode(err error) codes.Code { return status.Code(err) }

// The stream and bucket bounds: a stream beyond MaxStreams is refused
// with ResourceExhausted; a bucket beyond MaxBuckets is abandoned and not
// leased.
func TestRLQSBounds(t *testing.T) {
	h := startRLQS(t, config(), server.RLQSOptions{MaxStreams: 2, MaxBuckets: 2})
	a, b := h.newEnvoy("envoy"), h.newEnvoy("envoy")
	a.subscribe("b1", 1)
	b.subscribe("b1", 1)
	c := h.newEnvoy("envoy")
	// The server may end the stream before this send is written: gRPC's
	// Send then answers io.EOF, and the status comes with the receive.
	if err := c.stream.Send(&rlqspb.RateLimitQuotaUsageReports{Domain: "envoy", BucketQuotaUsages: usages("b1")}); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	if err := c.streamErr(); statusCode(err) != codes.ResourceExhausted {
		t.Fatalf("a third stream: %v, want ResourceExhausted", err)
	}
	a.subscribe("b2", 1)
	r := a.subscribe("b3", 1)
	if len(r.GetBucketAction()) != 1 || r.GetBucketAction()[0].GetAbandonAction() == nil {
		t.Fatalf("a third bucket: %v, want it abandoned", r)
	}
	if out := h.table.Outstanding("envoy/name=b3"); out != 0 {
		t.Fatalf("the abandoned third bucket holds %v", out)
	}
	// A flood of distinct buckets: every one abandoned, none tracked.
	names := make([]string, 5000)
	for i := range names {
		names[i] = fmt.Sprintf("flood%d", i)
	}
	a.send(&rlqspb.RateLimitQuotaUsageReports{Domain: "envoy", BucketQuotaUsages: usages(names...)})
	r = a.recv()
	if len(r.GetBucketAction()) != len(names) {
		t.Fatalf("%d actions for %d flooding buckets", len(r.GetBucketAction()), len(names))
	}
	for _, act := range r.GetBucketAction() {
		if act.GetAbandonAction() == nil {
			t.Fatalf("a flooding bucket was not abandoned: %v", act)
		}
	}
	pairs := 0
	for _, s := range h.table.Stats() {
		pairs += int(s.Clients)
	}
	if pairs != 3 { // a's b1 and b2, b's b1
		t.Fatalf("the table tracks %d (stream, bucket) pairs after the flood, want 3", pairs)
	}
}

// A replica that is not the capacity master grants nothing: each stream
// ends with Unavailable naming the master (Envoy reconnects, through its
// cluster, to the master), releasing what it held here.
func TestRLQSNotMaster(t *testing.T) {
	h := startRLQS(t, config(resource(apiResource, 100, lease.FairShare)), server.RLQSOptions{})
	e := h.newEnvoy("envoy")
	e.subscribe("api", 10)
	h.srv.SetMastership(false, "10.1.2.3:8081")
	e.sendReport(time.Second)
	err := e.streamErr()
	if statusCode(err) != codes.Unavailable || !strings.Contains(err.Error(), `"10.1.2.3:8081"`) {
		t.Fatalf("a report to a replica: %v, want Unavailable naming the master", err)
	}
	waitFor(t, "the stream's end", func() bool { return h.rlqs.Streams() == 0 })
	if out := h.table.Outstanding(apiResource); out != 0 {
		t.Fatalf("the replica still counts %v outstanding", out)
	}
}

// After a failover the new master is in learning mode: an Envoy
// reconnecting with the old master's assignment (seen as the rate it
// allowed) gets that back, not its fair share, until learning ends, so
// that the new master never grants beyond what the old one's assignments
// still hold; then the shares follow demand again.
func TestRLQSLearningModeAfterFailover(t *testing.T) {
	h := startRLQS(t, config(resource(apiResource, 100, lease.FairShare)), server.RLQSOptions{})
	h.srv.SetMastership(false, "")
	h.srv.SetMastership(true, "") // becomes master: learning mode, 60s
	a, b := h.newEnvoy("envoy"), h.newEnvoy("envoy")
	envoys := []*envoy{a, b}
	// The old master gave a 30 and b 70: a wants 200 (allowed 30, denied
	// 170), b wants its 70.
	a.buckets["api"] = &envoyBucket{name: "api", demand: 200, rate: 30, expires: h.clock.Now().Add(50 * time.Second), has: true}
	b.buckets["api"] = &envoyBucket{name: "api", demand: 70, rate: 70, expires: h.clock.Now().Add(50 * time.Second), has: true}
	for round := 1; round <= 5; round++ {
		h.clock.Advance(time.Second)
		for _, e := range envoys {
			e.report(time.Second)
			checkSplit(t, h, envoys, "api", apiResource, 100, fmt.Sprintf("learning, round %d", round))
		}
		if got := rates(envoys, "api"); !equal(got, []float64{30, 70}) {
			t.Fatalf("learning, round %d: rates %v, want what the old master gave, [30 70]", round, got)
		}
	}
	h.clock.Advance(60 * time.Second)
	b.buckets["api"].demand = 20
	if r := runRounds(t, h, envoys, 100, 10, []float64{80, 20}); r < 0 {
		t.Fatalf("after learning: rates %v, want the demand's [80 20]", rates(envoys, "api"))
	}
}

// A full table (Options.MaxClients (stream, bucket) pairs): a new bucket
// is abandoned while the buckets the table has are still served; a bucket
// the table forgot (its lease expired before the expiry pass dropped it)
// and has no room to take back is abandoned, not an error ending the
// stream.
func TestRLQSTableFull(t *testing.T) {
	h := startRLQSWith(t, config(resource(apiResource, 100, lease.FairShare)), server.Options{MaxClients: 1}, server.RLQSOptions{})
	a, b := h.newEnvoy("envoy"), h.newEnvoy("envoy")
	a.subscribe("api", 50)
	r := b.subscribe("api", 50)
	if len(r.GetBucketAction()) != 1 || r.GetBucketAction()[0].GetAbandonAction() == nil {
		t.Fatalf("a bucket beyond the table's bound: %v, want it abandoned", r)
	}
	h.clock.Advance(time.Second)
	a.report(time.Second)
	if got := a.rate("api"); got != 50 {
		t.Fatalf("the bucket the table has: rate %v, want 50", got)
	}
	// a's lease expires unreported: the table forgets it, and b's bucket
	// takes the room before a reports again.
	h.clock.Advance(61 * time.Second)
	b.subscribe("api", 50)
	if got := b.rate("api"); got != 1 {
		t.Fatalf("b after a's lease expired: rate %v, want its first report's 1", got)
	}
	r = a.report(time.Second)
	if len(r.GetBucketAction()) != 1 || r.GetBucketAction()[0].GetAbandonAction() == nil {
		t.Fatalf("a bucket the table forgot, with no room: %v, want it abandoned", r)
	}
	if out := h.table.Outstanding(apiResource); out > 100 {
		t.Fatalf("outstanding %v, over the quota", out)
	}
}

// Close ends the long-lived streams (Unavailable: Envoy reconnects
// elsewhere) and refuses new ones, so that the gRPC server's GracefulStop
// is not held by them; the leases stay counted (the Envoys keep their
// assignments until the TTL).
func TestRLQSCloseEndsStreams(t *testing.T) {
	h := startRLQS(t, config(resource(apiResource, 100, lease.FairShare)), server.RLQSOptions{})
	e := h.newEnvoy("envoy")
	e.subscribe("api", 10)
	h.rlqs.Close()
	if err := e.streamErr(); statusCode(err) != codes.Unavailable || !strings.Contains(err.Error(), "stopping") {
		t.Fatalf("an open stream at Close: %v, want Unavailable (stopping)", err)
	}
	late := h.newEnvoy("envoy")
	// Send may already see the stream ended (io.EOF): the server refuses
	// it at once; its status is what streamErr reads.
	if err := late.stream.Send(&rlqspb.RateLimitQuotaUsageReports{Domain: "envoy", BucketQuotaUsages: usages("api")}); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	if err := late.streamErr(); statusCode(err) != codes.Unavailable {
		t.Fatalf("a stream after Close: %v, want Unavailable", err)
	}
	if out := h.table.Outstanding(apiResource); out == 0 {
		t.Fatal("Close released a lease its Envoy still enforces")
	}
	done := make(chan struct{})
	go func() {
		h.gs.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("GracefulStop still waiting 10s after Close")
	}
}
