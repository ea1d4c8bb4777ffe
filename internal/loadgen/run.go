package loadgen

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// tally counts outcomes and latencies. One covers the measured window; a
// fresh one covers each progress interval.
type tally struct {
	ok, over, unknown, errs atomic.Uint64
	codes                   [17]atomic.Uint64 // errors by gRPC status code
	lat                     *Histogram
}

func newTally() *tally { return &tally{lat: NewHistogram()} }

func (t *tally) add(lat time.Duration, resp *rlsv3.RateLimitResponse, err error) {
	t.lat.Record(lat)
	switch {
	case err != nil:
		t.errs.Add(1)
		c := status.Code(err)
		if int(c) >= len(t.codes) {
			c = codes.Unknown
		}
		t.codes[c].Add(1)
	case resp.GetOverallCode() == rlsv3.RateLimitResponse_OK:
		t.ok.Add(1)
	case resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT:
		t.over.Add(1)
	default:
		t.unknown.Add(1)
	}
}

// run is the state of one benchmark run.
type run struct {
	cfg     *Config
	reqs    *requests
	clients []rlsv3.RateLimitServiceClient

	t0, warmEnd, end time.Time
	stopped          chan struct{} // closed when no new request may start
	stopOnce         sync.Once
	stopAt           atomic.Int64 // ns since t0 at which the window was cut short (0: not)

	win      *tally
	interval atomic.Pointer[tally]

	// open loop
	sendLag      *Histogram
	late, sent   atomic.Uint64
	inflight     atomic.Int64
	workers      atomic.Int64
	intendedWin  uint64
	peakInFlight atomic.Int64
	wakeEarly    time.Duration // dispatcher only: how early to set the timer
}

func (r *run) stop() { r.stopOnce.Do(func() { close(r.stopped) }) }

// windowEnd is the end of the measured window: the planned end, or the time
// the run was interrupted.
func (r *run) windowEnd() time.Time {
	if ns := r.stopAt.Load(); ns != 0 {
		if t := r.t0.Add(time.Duration(ns)); t.Before(r.end) {
			return t
		}
	}
	return r.end
}

func (r *run) inWindow(t time.Time) bool {
	return !t.Before(r.warmEnd) && t.Before(r.windowEnd())
}

func (r *run) pick() *rlsv3.RateLimitRequest {
	k := 0
	if r.cfg.Keys > 1 {
		k = rand.IntN(r.cfg.Keys)
	}
	return r.reqs.get(k)
}

// call sends one request; ref is the time latency is measured from (the
// actual send time closed-loop, the intended one open-loop).
func (r *run) call(client rlsv3.RateLimitServiceClient, ref time.Time) error {
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.Timeout)
	resp, err := client.ShouldRateLimit(ctx, r.pick())
	cancel()
	lat := time.Since(ref)
	if r.inWindow(ref) {
		r.win.add(lat, resp, err)
	}
	r.interval.Load().add(lat, resp, err)
	return err
}

// unreachable is how long a closed-loop caller pauses after a call that
// found no server (Unavailable): a server gone answers at once, and
// callers looping on that used a core to count errors.
const unreachable = 10 * time.Millisecond

// Run performs one benchmark: dials cfg.Addr, checks that it answers, runs
// the warmup and the measured phase, waits for the requests still in flight
// and returns the result. Cancelling ctx ends the run early; the result then
// covers the part of the measured phase that ran (Interrupted is set), or
// Run returns an error if the measured phase had not begun.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	cfg.setDefaults()
	if cfg.Addr == "" {
		return nil, errors.New("no address")
	}
	r, closeConns, err := dial(&cfg)
	if err != nil {
		return nil, err
	}
	defer closeConns()
	if err := r.probe(ctx); err != nil {
		return nil, err
	}
	server := &watched{flag: "--cpu-pid", pid: cfg.CPUPid}
	store := &watched{flag: "--store-pid", pid: cfg.StorePid}
	for _, w := range []*watched{server, store} {
		if err := w.check(); err != nil {
			return nil, err
		}
	}
	m, err := r.measure(ctx, server, store)
	if err != nil {
		return nil, err
	}
	res := r.result(m.wall, !m.completed)
	decided := res.OK + res.OverLimit + res.Unknown
	if res.ServerCPU, err = server.result(m.wall, decided, res.Requests); err != nil {
		return nil, err
	}
	if res.StoreCPU, err = store.result(m.wall, decided, res.Requests); err != nil {
		return nil, err
	}
	if m.selfOK {
		res.ClientCPU = newCPUResult(0, m.self, m.wall, decided, res.Requests)
	}
	return res, nil
}

// dial makes the run and its cfg.Conns connections; closeConns closes
// them.
func dial(cfg *Config) (r *run, closeConns func(), err error) {
	creds, err := cfg.TLS.Credentials()
	if err != nil {
		return nil, nil, fmt.Errorf("TLS: %w", err)
	}
	r = &run{cfg: cfg, reqs: newRequests(cfg), stopped: make(chan struct{}), win: newTally(), sendLag: NewHistogram()}
	r.interval.Store(newTally())
	var conns []*grpc.ClientConn
	closeConns = func() {
		for _, cc := range conns {
			cc.Close()
		}
	}
	for i := 0; i < cfg.Conns; i++ {
		cc, err := grpc.NewClient(cfg.Addr, grpc.WithTransportCredentials(creds), grpc.WithUserAgent("floodgate-bench"))
		if err != nil {
			closeConns()
			return nil, nil, err
		}
		conns = append(conns, cc)
		r.clients = append(r.clients, rlsv3.NewRateLimitServiceClient(cc))
	}
	return r, closeConns, nil
}

// probe sends one request on every connection: fail fast if the server is
// not there, and have the connections up before the clock starts. A check
// (every descriptor's hits_addend 0), so it consumes nothing the report
// would not count.
func (r *run) probe(ctx context.Context) error {
	for _, c := range r.clients {
		pctx, cancel := context.WithTimeout(ctx, min(r.cfg.Timeout, 5*time.Second))
		check := proto.Clone(r.pick()).(*rlsv3.RateLimitRequest)
		for _, d := range check.Descriptors {
			d.HitsAddend = wrapperspb.UInt64(0)
		}
		_, err := c.ShouldRateLimit(pctx, check, grpc.WaitForReady(true))
		cancel()
		switch status.Code(err) {
		case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
			return fmt.Errorf("cannot reach %s: %v", r.cfg.Addr, err)
		case codes.Unimplemented:
			return fmt.Errorf("%s does not serve envoy.service.ratelimit.v3.RateLimitService: %v", r.cfg.Addr, err)
		}
	}
	return nil
}

// measurement is what the measured phase found: how long it lasted,
// whether it ran to its planned end, and this process's CPU time over it
// (self, if selfOK).
type measurement struct {
	wall, self        time.Duration
	completed, selfOK bool
}

// measure runs the warmup and the measured phase, sampling the watched
// processes' CPU time at its edges, and waits for the load to end.
func (r *run) measure(ctx context.Context, server, store *watched) (measurement, error) {
	r.t0 = time.Now()
	r.warmEnd = r.t0.Add(r.cfg.Warmup)
	r.end = r.warmEnd.Add(r.cfg.Duration)
	finish := r.startLoad()
	if !sleepUntil(ctx, r.warmEnd) {
		r.interrupt()
		finish()
		return measurement{}, errors.New("interrupted during the warmup: nothing measured")
	}
	server.start()
	store.start()
	self0, selfOK := selfCPU()
	completed := sleepUntil(ctx, r.end)
	if !completed {
		r.interrupt()
	}
	server.stop()
	store.stop()
	self1, _ := selfCPU()
	m := measurement{wall: r.windowEnd().Sub(r.warmEnd), self: self1 - self0, completed: completed, selfOK: selfOK}
	// Not r.stop(): the open loop still sends what was due in the window
	// and is not out yet (a backlog after a stall), up to Timeout past the
	// end; the closed loop stops by itself at the end.
	finish()
	return m, nil
}

// startLoad starts the load (the open loop or the closed one) and the
// progress lines; finish waits for the load to end, then stops the
// progress lines.
func (r *run) startLoad() (finish func()) {
	var wg sync.WaitGroup
	if r.cfg.Rate > 0 {
		wg.Go(r.openLoop)
	} else {
		wg.Go(r.closedLoop)
	}
	progressDone := make(chan struct{})
	var progressWG sync.WaitGroup
	if r.cfg.Progress != nil {
		progressWG.Go(func() { r.progress(progressDone) })
	}
	return func() {
		wg.Wait()
		close(progressDone)
		progressWG.Wait() // no progress line after Run returns
	}
}

// interrupt cuts the measured window short now and stops new requests.
func (r *run) interrupt() {
	r.stopAt.Store(int64(max(time.Since(r.t0), 1)))
	r.stop()
}

// watched is a process (--cpu-pid, --store-pid) whose CPU time over the
// measured window is reported; pid 0 is none.
type watched struct {
	flag   string
	pid    int
	t0, t1 time.Duration
	err    error
}

// check fails if the process cannot be read.
func (w *watched) check() error {
	if w.pid == 0 {
		return nil
	}
	if _, err := procCPU(w.pid); err != nil {
		return fmt.Errorf("%s: %w", w.flag, err)
	}
	return nil
}

func (w *watched) start() {
	if w.pid > 0 {
		w.t0, _ = procCPU(w.pid)
	}
}

func (w *watched) stop() {
	if w.pid > 0 {
		w.t1, w.err = procCPU(w.pid)
	}
}

// result is the CPU used over wall, per decided and sent request; nil
// for no process.
func (w *watched) result(wall time.Duration, decided, requests uint64) (*CPUResult, error) {
	if w.pid == 0 {
		return nil, nil
	}
	if w.err != nil {
		return nil, fmt.Errorf("%s: reading after the run: %w", w.flag, w.err)
	}
	return newCPUResult(w.pid, w.t1-w.t0, wall, decided, requests), nil
}

// sleepUntil waits for t; false if ctx ended first.
func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// closedLoop runs Concurrency callers, each sending its next request as soon
// as the previous one is answered, until the end of the window.
func (r *run) closedLoop() {
	var wg sync.WaitGroup
	for i := 0; i < r.cfg.Concurrency; i++ {
		client := r.clients[i%len(r.clients)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-r.stopped:
					return
				default:
				}
				s := time.Now()
				if !s.Before(r.end) {
					return
				}
				if err := r.call(client, s); status.Code(err) == codes.Unavailable {
					time.Sleep(unreachable)
				}
			}
		}()
	}
	r.workers.Store(int64(r.cfg.Concurrency))
	r.peakInFlight.Store(int64(r.cfg.Concurrency))
	wg.Wait()
}

// openLoop offers Rate requests per second: request i is due at
// t0 + i/Rate whatever happened to the ones before it, and its latency is
// measured from that intended time, so a server stall shows in full in the
// latency of every request scheduled during it (no coordinated omission).
//
// A dispatcher hands each due request to an idle worker, starting a new
// worker whenever none is idle, up to MaxInFlight; so the schedule is kept
// as long as fewer than MaxInFlight requests are outstanding. Past that,
// due requests wait for a worker and go out late (counted, and their wait
// is part of their latency). Requests due in the window but still unsent
// when the backlog has not cleared Timeout after the end are reported as
// unsent.
func (r *run) openLoop() {
	per := float64(time.Second) / r.cfg.Rate
	due := func(i int64) time.Time { return r.t0.Add(time.Duration(float64(i) * per)) }
	work := make(chan time.Time) // unbuffered: a send succeeds only to an idle worker
	var wg sync.WaitGroup
	r.dispatch(due, work, &wg)
	close(work)
	r.intendedWin = r.intended(due)
	wg.Wait()
}

// dispatch hands each request due before the end to an idle worker on
// work, or to a new one (in wg) while there are fewer than MaxInFlight,
// or else waits for a worker to be free; it gives up when the run is
// stopped or Timeout after the end.
func (r *run) dispatch(due func(int64) time.Time, work chan time.Time, wg *sync.WaitGroup) {
	pt := newPreciseTimer()
	defer pt.close()
	hardStop := time.NewTimer(time.Until(r.end.Add(r.cfg.Timeout)))
	defer hardStop.Stop()
	tm := time.NewTimer(time.Hour)
	defer tm.Stop()
	nworkers := 0
	for i := int64(0); ; i++ {
		t := due(i)
		if !t.Before(r.end) || !r.waitUntil(t, tm, pt) {
			return
		}
		select {
		case work <- t:
			continue
		default:
		}
		if nworkers < r.cfg.MaxInFlight {
			nworkers++
			r.workers.Store(int64(nworkers))
			client := r.clients[nworkers%len(r.clients)]
			wg.Go(func() { r.worker(client, t, work) })
			continue
		}
		select {
		case work <- t:
		case <-r.stopped:
			return
		case <-hardStop.C:
			return
		}
	}
}

// worker sends the request due at first, then each one handed to it on
// work, until work is closed.
func (r *run) worker(client rlsv3.RateLimitServiceClient, first time.Time, work <-chan time.Time) {
	for t, ok := first, true; ok; t, ok = <-work {
		r.send(client, t)
	}
}

// send sends the request due at t, counting it in flight (and at its peak)
// and, in the window, as sent and how late.
func (r *run) send(client rlsv3.RateLimitServiceClient, t time.Time) {
	n := r.inflight.Add(1)
	for {
		p := r.peakInFlight.Load()
		if n <= p || r.peakInFlight.CompareAndSwap(p, n) {
			break
		}
	}
	lag := time.Since(t)
	if r.inWindow(t) {
		r.sent.Add(1)
		r.sendLag.Record(lag)
		if lag > r.cfg.LateThreshold {
			r.late.Add(1)
		}
	}
	r.call(client, t)
	r.inflight.Add(-1)
}

// intended counts the requests due in the window, sent or not.
func (r *run) intended(due func(int64) time.Time) uint64 {
	we := r.windowEnd()
	var n uint64
	for j := int64(0); ; j++ {
		t := due(j)
		if !t.Before(we) {
			return n
		}
		if !t.Before(r.warmEnd) {
			n++
		}
	}
}

// waitUntil sleeps until t: on a Go timer to within a couple of
// milliseconds of it, then on both a Go timer and the timerfd (whichever
// wakes first: see preciseTimer), set early by their median wake-up latency
// (learnt as it goes), and yields in a loop over what is left. False if the
// run was stopped.
func (r *run) waitUntil(t time.Time, tm *time.Timer, pt *preciseTimer) bool {
	for {
		d := time.Until(t)
		if d <= 0 {
			return true
		}
		select {
		case <-r.stopped:
			return false
		default:
		}
		switch {
		case d > 3*time.Millisecond:
			tm.Reset(d - 2*time.Millisecond)
			select {
			case <-tm.C:
			case <-r.stopped:
				return false
			}
		case d > r.wakeEarly+spinBelow:
			s := d - r.wakeEarly
			target := time.Now().Add(s)
			fired := pt.arm(s)
			tm.Reset(s)
			select {
			case <-tm.C:
			case <-fired:
			}
			// Track the median wake-up latency (a stale tick, early,
			// says nothing): a mean would chase the scheduler's tail
			// and have the loop below spin for it.
			if over := time.Since(target); over >= 0 {
				if over > r.wakeEarly {
					r.wakeEarly = min(r.wakeEarly+time.Microsecond, maxWakeEarly)
				} else {
					r.wakeEarly = max(r.wakeEarly-time.Microsecond, 0)
				}
			}
		default:
			runtime.Gosched()
		}
	}
}

const (
	// spinBelow: waits shorter than this are not worth a timer's system calls.
	spinBelow = 10 * time.Microsecond
	// maxWakeEarly bounds the learnt wake-up latency.
	maxWakeEarly = 100 * time.Microsecond
)

// progress prints a line every second until done is closed.
func (r *run) progress(done chan struct{}) {
	tk := time.NewTicker(time.Second)
	defer tk.Stop()
	last := r.t0
	for {
		select {
		case <-done:
			return
		case now := <-tk.C:
			iv := r.interval.Swap(newTally())
			dt := now.Sub(last).Seconds()
			mid := last.Add(now.Sub(last) / 2)
			last = now
			phase := "run "
			if mid.Before(r.warmEnd) {
				phase = "warm"
			} else if !mid.Before(r.windowEnd()) {
				phase = "tail" // requests still in flight after the end
			}
			n := iv.ok.Load() + iv.over.Load() + iv.unknown.Load() + iv.errs.Load()
			line := fmt.Sprintf("%6.1fs %s %9.0f req/s  ok %d  over %d  err %d  p50 %s  p99 %s  max %s",
				now.Sub(r.t0).Seconds(), phase, float64(n)/dt, iv.ok.Load(), iv.over.Load(), iv.errs.Load(),
				fmtDur(iv.lat.Quantile(0.5)), fmtDur(iv.lat.Quantile(0.99)), fmtDur(iv.lat.Max()))
			if r.cfg.Rate > 0 {
				line += fmt.Sprintf("  in flight %d/%d  late %d", r.inflight.Load(), r.workers.Load(), r.late.Load())
			}
			fmt.Fprintln(r.cfg.Progress, line)
		}
	}
}
