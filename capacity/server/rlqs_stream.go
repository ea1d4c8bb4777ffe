package server

import (
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
	"sync"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/floodgate/floodgate/internal/lease"
)

type (
	rlqsReports  = rlqspb.RateLimitQuotaUsageReports
	rlqsResponse = rlqspb.RateLimitQuotaResponse
	rlqsAction   = rlqspb.RateLimitQuotaResponse_BucketAction
)

// rlqsStream is one Envoy's stream: one client of the Table.
type rlqsStream struct {
	r      *RLQS
	client string        // the Table's client id: "rlqs/<seq>/<peer>"
	poke   chan struct{} // wakes the stream to send what a sweep queued

	notMaster bool // the stream ends because this server is not the master

	mu      sync.Mutex
	closed  bool
	domain  string
	buckets map[string]*rlqsBucket // by resource id
	pending map[string]*rlqsAction // queued by a sweep, sent next
	reqs    []lease.Request        // scratch
	out     []lease.Lease          // scratch
}

// rlqsBucket is one bucket a stream subscribed to.
type rlqsBucket struct {
	id         *rlqspb.BucketId // as Envoy sent it first, for the answers
	resource   string           // BucketResource
	entry      string           // the configuration entry serving it (its ID)
	gen        uint64           // the configuration generation entry is from
	leaseLen   time.Duration    // the entry's lease length
	lease      lease.Lease      // the last lease sent
	wants      float64          // its last demand
	lastReport time.Time
	lastActive time.Time // last report with requests in it
}

// usage is one validated BucketQuotaUsage.
type usage struct {
	id       *rlqspb.BucketId
	resource string
	count    float64       // requests allowed and denied
	allowed  float64       // requests allowed
	elapsed  time.Duration // 0: not known (Envoy's first report, or under a second)
}

// StreamRateLimitQuotas serves one Envoy: each report's buckets are
// granted (one Table.Get for the report), and each gets a token-bucket
// assignment of its lease, or an abandon action. A malformed report ends
// the stream with InvalidArgument, changing nothing.
//
// When the stream ends, its leases are released at once if the Envoy
// closed it (its half-close: it is done with them), or if this server is
// not the master; otherwise (a reset, a cancel, a cut connection, an
// error) the Envoy may still be enforcing its assignments, until their
// TTL, and the leases stay counted until they expire (their expiry is
// after the TTL), so that what it still admits is never granted to
// another Envoy meanwhile.
func (r *RLQS) StreamRateLimitQuotas(stream grpc.BidiStreamingServer[rlqsReports, rlqsResponse]) error {
	st, err := r.open(stream)
	if err != nil {
		return err
	}
	err = st.serve(stream)
	closed := errors.Is(err, io.EOF)
	r.closeStream(st, closed || st.notMaster)
	if closed {
		return nil
	}
	r.metrics.errors[errorIndex(err, st.notMaster)].Add(1)
	return err
}

// errStopping ends the streams of a closed RLQS.
var errStopping = status.Error(codes.Unavailable, "rlqs: the server is stopping")

// errorIndex is the index in rlqsErrorCodes of the error a stream ended
// with.
func errorIndex(err error, notMaster bool) int {
	switch {
	case notMaster || errors.Is(err, errStopping):
		return 1
	case status.Code(err) == codes.InvalidArgument:
		return 0
	case status.Code(err) == codes.Internal:
		return 3
	}
	return 4
}

// serve runs the stream until it ends: the Envoy's half-close (io.EOF),
// an error, or the context's end.
func (st *rlqsStream) serve(stream grpc.BidiStreamingServer[rlqsReports, rlqsResponse]) error {
	ctx := stream.Context()
	msgs := make(chan *rlqsReports)
	errc := make(chan error, 1)
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				errc <- err
				return
			}
			select {
			case msgs <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	for {
		var resp *rlqsResponse
		var err error
		select {
		case m := <-msgs:
			resp, err = st.report(m)
		case <-st.poke:
			resp = st.flush()
		case err = <-errc:
		case <-ctx.Done():
			err = status.FromContextError(ctx.Err()).Err()
		case <-st.r.closing:
			err = errStopping
		}
		if err == nil && resp != nil {
			err = stream.Send(resp)
		}
		if err != nil {
			return err
		}
	}
}

// open registers a new stream, or refuses it beyond MaxStreams.
func (r *RLQS) open(stream grpc.ServerStream) (*rlqsStream, error) {
	addr := "unknown"
	if p, ok := peer.FromContext(stream.Context()); ok && p.Addr != nil {
		addr = p.Addr.String()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	select {
	case <-r.closing:
		r.metrics.errors[1].Add(1)
		return nil, errStopping
	default:
	}
	if len(r.streams) >= r.opts.MaxStreams {
		r.metrics.errors[2].Add(1)
		return nil, status.Errorf(codes.ResourceExhausted, "rlqs: %d streams open, the most this server takes", len(r.streams))
	}
	r.seq++
	st := &rlqsStream{
		r:       r,
		client:  fmt.Sprintf("rlqs/%d/%s", r.seq, addr),
		poke:    make(chan struct{}, 1),
		buckets: make(map[string]*rlqsBucket),
		pending: make(map[string]*rlqsAction),
	}
	r.streams[st] = struct{}{}
	return st, nil
}

// closeStream unregisters st and, if release, releases its leases (else
// they expire on their own).
func (r *RLQS) closeStream(st *rlqsStream, release bool) {
	r.mu.Lock()
	delete(r.streams, st)
	r.mu.Unlock()
	st.mu.Lock()
	defer st.mu.Unlock()
	st.closed = true
	resources := make([]string, 0, len(st.buckets))
	for key := range st.buckets {
		resources = append(resources, key)
	}
	if release && len(resources) > 0 {
		r.table.Release(st.client, resources)
	}
	st.buckets = nil
	st.pending = nil
}

// wake tells the stream's goroutine that actions are pending.
func (st *rlqsStream) wake() {
	select {
	case st.poke <- struct{}{}:
	default:
	}
}

// report handles one usage report: validate all of it, then grant its
// buckets and answer them in order (after any actions a sweep queued).
func (st *rlqsStream) report(m *rlqsReports) (*rlqsResponse, error) {
	st.r.metrics.reports.Add(1)
	now := st.r.now()
	cfg := st.r.config()
	if isMaster, master := st.r.srv.Mastership(); !isMaster {
		st.notMaster = true
		return nil, status.Errorf(codes.Unavailable, "rlqs: this server is not the capacity master (the master: %q)", master)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	domain, err := st.checkDomain(m.GetDomain())
	if err != nil {
		return nil, err
	}
	us, err := parseUsages(domain, m.GetBucketQuotaUsages())
	if err != nil {
		return nil, err
	}
	st.domain = domain
	skip := st.abandoning(us)
	resp := st.takePending(us)
	actions, err := st.grant(us, skip, cfg, now)
	if err != nil {
		return nil, err
	}
	resp = append(resp, actions...)
	if len(resp) == 0 {
		return nil, nil
	}
	return &rlqsResponse{BucketAction: resp}, nil
}

// checkDomain returns the stream's domain after a report naming domain:
// the first report must name it; the later ones may repeat it or leave it
// empty, never change it.
func (st *rlqsStream) checkDomain(domain string) (string, error) {
	switch {
	case st.domain == "" && domain == "":
		return "", status.Error(codes.InvalidArgument, "rlqs: domain: missing in the stream's first report")
	case st.domain == "":
		return domain, nil
	case domain != "" && domain != st.domain:
		return "", status.Errorf(codes.InvalidArgument, "rlqs: domain: %q, but the stream's domain is %q (open a new stream for another domain)", domain, st.domain)
	}
	return st.domain, nil
}

// parseUsages validates a report's usages, all of them before any is
// used, and returns them with their resource ids.
func parseUsages(domain string, in []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage) ([]usage, error) {
	out := make([]usage, 0, len(in))
	seen := make(map[string]int, len(in))
	for i, u := range in {
		p, msg := parseUsage(domain, u)
		if msg != "" {
			return nil, status.Error(codes.InvalidArgument, "rlqs: "+bucketError(i, "%s", msg))
		}
		if j, dup := seen[p.resource]; dup {
			return nil, status.Error(codes.InvalidArgument, "rlqs: "+bucketError(i, "bucket_id: the bucket of bucket_quota_usages[%d] again", j))
		}
		seen[p.resource] = i
		out = append(out, p)
	}
	return out, nil
}

// parseUsage validates one usage; a non-empty message says what is wrong.
func parseUsage(domain string, u *rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage) (usage, string) {
	bucket := u.GetBucketId().GetBucket()
	if len(bucket) == 0 {
		return usage{}, "bucket_id: missing (a bucket id has at least one key)"
	}
	size := len(domain) + 1
	for k, v := range bucket {
		if k == "" {
			return usage{}, "bucket_id: an empty key"
		}
		if v == "" {
			return usage{}, fmt.Sprintf("bucket_id[%.64q]: an empty value", k)
		}
		size += len(k) + len(v) + 2
	}
	if size > MaxBucketIDBytes {
		return usage{}, fmt.Sprintf("bucket_id: %d bytes with the domain, over %d", size, MaxBucketIDBytes)
	}
	resource := BucketResource(domain, bucket)
	if len(resource) > MaxBucketIDBytes {
		return usage{}, fmt.Sprintf("bucket_id: %d bytes with the domain and escapes (%.64q...), over %d", len(resource), resource, MaxBucketIDBytes)
	}
	te := u.GetTimeElapsed()
	if te == nil {
		return usage{}, "time_elapsed: missing"
	}
	if err := te.CheckValid(); err != nil {
		return usage{}, fmt.Sprintf("time_elapsed: %v", err)
	}
	elapsed := te.AsDuration()
	switch {
	case elapsed < 0:
		return usage{}, fmt.Sprintf("time_elapsed: %v is negative", elapsed)
	case elapsed > MaxReportElapsed:
		return usage{}, fmt.Sprintf("time_elapsed: %v is over %v", elapsed, MaxReportElapsed)
	}
	allowed, denied := u.GetNumRequestsAllowed(), u.GetNumRequestsDenied()
	if allowed > maxCount || denied > maxCount {
		return usage{}, fmt.Sprintf("num_requests_allowed %d or num_requests_denied %d: over 2^53", allowed, denied)
	}
	return usage{
		id:       u.GetBucketId(),
		resource: resource,
		count:    float64(allowed) + float64(denied),
		allowed:  float64(allowed),
		elapsed:  elapsed,
	}, ""
}

// abandoning returns the usages' buckets a sweep queued an abandon for:
// the report's usage of them is skipped (Envoy erases the bucket on the
// abandon, sent first, and subscribes again on its next request).
func (st *rlqsStream) abandoning(us []usage) map[string]bool {
	var skip map[string]bool
	for _, u := range us {
		if a, ok := st.pending[u.resource]; ok && a.GetAbandonAction() != nil {
			if skip == nil {
				skip = make(map[string]bool)
			}
			skip[u.resource] = true
		}
	}
	return skip
}

// takePending returns the actions a sweep queued, in resource order, and
// clears them; a pending assignment that one of us renews is dropped.
func (st *rlqsStream) takePending(us []usage) []*rlqsAction {
	if len(st.pending) == 0 {
		return nil
	}
	for _, u := range us {
		if a, ok := st.pending[u.resource]; ok && a.GetAbandonAction() == nil {
			delete(st.pending, u.resource)
		}
	}
	keys := make([]string, 0, len(st.pending))
	for k := range st.pending {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]*rlqsAction, 0, len(keys))
	for _, k := range keys {
		out = append(out, st.pending[k])
	}
	clear(st.pending)
	return out
}

// flush returns the pending actions as a response, nil if none.
func (st *rlqsStream) flush() *rlqsResponse {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closed {
		return nil
	}
	actions := st.takePending(nil)
	if len(actions) == 0 {
		return nil
	}
	return &rlqsResponse{BucketAction: actions}
}

// demand returns a usage's demand in requests per second: its requests
// over its time_elapsed, or when Envoy sent 0 (its first report of the
// bucket, or an interval under a second: Envoy sends whole seconds) over
// the time since the bucket's last report here (at least 100ms), or a
// second for a new bucket; floored at MinDemand, capped at 1e15.
func (st *rlqsStream) demand(u usage, b *rlqsBucket, now time.Time) float64 {
	elapsed := u.elapsed
	if elapsed <= 0 {
		elapsed = time.Second
		if b != nil {
			elapsed = max(now.Sub(b.lastReport), 100*time.Millisecond)
		}
	}
	w := u.count / elapsed.Seconds()
	return min(max(w, st.r.opts.MinDemand), maxDemand)
}

// assignment is the action granting l for bucket id at now.
func (st *rlqsStream) assignment(id *rlqspb.BucketId, l lease.Lease, now time.Time) *rlqsAction {
	ttl := l.Expiry.Sub(now) - st.r.opts.TTLMargin
	secs := int64(math.Max(0, math.Floor(ttl.Seconds())))
	fill := int64(st.r.opts.FillInterval / time.Second)
	return &rlqsAction{
		BucketId: id,
		BucketAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
			QuotaAssignmentAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
				AssignmentTimeToLive: &durationpb.Duration{Seconds: secs},
				RateLimitStrategy: &typev3.RateLimitStrategy{
					Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: TokenBucket(l.Capacity, fill)},
				},
			},
		},
	}
}

// abandon is the action abandoning bucket id.
func abandon(id *rlqspb.BucketId) *rlqsAction {
	return &rlqsAction{
		BucketId: id,
		BucketAction: &rlqspb.RateLimitQuotaResponse_BucketAction_AbandonAction_{
			AbandonAction: &rlqspb.RateLimitQuotaResponse_BucketAction_AbandonAction{},
		},
	}
}
