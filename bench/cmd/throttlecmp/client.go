package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// unitRounds is the calibrated work unit every server burns.
var unitRounds int

// result is one run's figures.
type result struct {
	goodput         float64 // work done in the window and answered 200, per server CPU-second, % of capacity
	goodputByAnswer float64 // the former measure: work of the 200s answered in the window (by the answer's time), whenever done
	critSuccess     float64 // %
	p99             time.Duration
	n, ok, refused  int
	crit, critOK    int
	wastePerRefused float64 // µs of server CPU not in answered work, per refused request
	unanswered      float64 // % of the work the server completed whose answer was not a 200 in time
	perCPU          float64 // capacity, units per server CPU-second
	// From the server's per-request CPU accounting (meter.go), over the
	// window: the mean CPU of a metered request answered 503 (µs), of
	// one answered 200 per unit of work (µs), and the CPU spent on
	// refused requests as % of the server's CPU in the window (the mean
	// times the 503s the client got).
	shedCPU, okCPUPerUnit, shedShare float64
	shedAtOnceCPU, shedWaitedCPU     float64 // the mean over 503s at once, and over 503s after a wait (µs)
	shedMetered, shedWaited          int
	// answeredCPU is the server's CPU in the window that went into work
	// answered 200 (%): that work's units times the CPU a unit of a
	// metered 200 took in the same run. Unlike goodput it needs no
	// capacity measured at another time on a host whose speed drifts.
	answeredCPU float64
	// underLoad is the work done while the load was offered (answered
	// or not, without the drain after it) per server CPU-second, % of
	// capacity: the drain serves what a queue still holds without
	// refusals to pay, so a longer queue gains there.
	underLoad float64
	// goodputInstr is goodput counted in the instructions the server
	// retired instead of its CPU time (perf.go): the work done in the
	// window and answered 200 per instruction, as % of the same in the
	// capacity phases (perGInstr, units per billion instructions). 0 if
	// they could not be counted.
	goodputInstr, perGInstr float64
	limits                  string  // Floodgate's limit and in flight, p10 p50 p90
	idle                    float64 // % of the server's processors' time idle in the window (Go's estimate)
}

func (r result) String() string {
	s := fmt.Sprintf("goodput %5.1f%% (by answer %5.1f%%)  CRITICAL %d/%d = %6.2f%%  p99 %4dms  requests %d ok %d shed %d  work unanswered %4.1f%%  capacity %.0f units/CPU-s  CPU/503 %4.0fµs (%d metered; at once %.0fµs, %d after a wait %.0fµs) = %4.2f%% of server CPU  CPU/unit of 200s %4.0fµs  CPU in answered work %5.1f%%",
		r.goodput, r.goodputByAnswer, r.critOK, r.crit, r.critSuccess, r.p99.Milliseconds(), r.n, r.ok, r.refused, r.unanswered, r.perCPU,
		r.shedCPU, r.shedMetered, r.shedAtOnceCPU, r.shedWaited, r.shedWaitedCPU, r.shedShare, r.okCPUPerUnit, r.answeredCPU)
	s += fmt.Sprintf("  Ps idle %.1f%%  work under load %.1f%%", r.idle, r.underLoad)
	if r.goodputInstr > 0 {
		s += fmt.Sprintf("  goodput by instructions %.2f%% (capacity %.1f units/G instr)", r.goodputInstr, r.perGInstr)
	}
	if r.limits != "" {
		s += "  limit/inflight p10,50,90 " + r.limits
	}
	return s
}

// server is a running server process.
type server struct {
	url string
	cmd *exec.Cmd
	in  io.WriteCloser
	hc  *http.Client
	ctl *http.Client // the harness's own calls (stats, marks): not queued behind the load's connections
}

// profileDir, if set, is where each server writes its CPU profile.
var profileDir string

func startServer(peer string, round int) (*server, error) {
	args := []string{"-serve", peer, "-per-unit", strconv.Itoa(unitRounds)}
	if profileDir != "" {
		args = append(args, "-cpuprofile", fmt.Sprintf("%s/%s-%d.pprof", profileDir, peer, round))
	}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if a, ok := strings.CutPrefix(sc.Text(), "ADDR "); ok {
			a, procs, _ := strings.Cut(a, " ")
			if procs != "GOMAXPROCS="+strconv.Itoa(runtime.GOMAXPROCS(0)) {
				fmt.Fprintf(os.Stderr, "warning: %s server runs with %s\n", peer, procs)
			}
			go io.Copy(io.Discard, out) //nolint:errcheck
			return &server{url: "http://" + a, cmd: cmd, in: in}, nil
		}
	}
	cmd.Process.Kill() //nolint:errcheck
	cmd.Wait()         //nolint:errcheck
	return nil, errors.New("server gave no address")
}

func (s *server) stop() {
	s.in.Close()                                                        // the server writes its profile and exits
	t := time.AfterFunc(5*time.Second, func() { s.cmd.Process.Kill() }) //nolint:errcheck
	s.cmd.Wait()                                                        //nolint:errcheck
	t.Stop()
	s.hc.CloseIdleConnections()
}

// stats reads the server's completed units and CPU time.
func (s *server) stats() (units int64, cpu time.Duration) {
	units, cpu, _ = s.stats3()
	return units, cpu
}

// stats3 also reads the units done since /mark (by requests completed).
func (s *server) stats3() (units int64, cpu time.Duration, counted int64) {
	var us int64
	s.get("/stats", func(r io.Reader) { fmt.Fscan(r, &units, &us, &counted) }) //nolint:errcheck
	return units, time.Duration(us) * time.Microsecond, counted
}

// get fetches a harness path (bypassing the peer) and hands its body to read.
func (s *server) get(path string, read func(io.Reader)) {
	req, _ := http.NewRequest("GET", s.url+path, nil)
	req.Header.Set(bypass, "1")
	resp, err := s.ctl.Do(req)
	if err != nil {
		fmt.Fprintf(os.Stderr, "harness call %s: %v\n", path, err)
		return
	}
	defer resp.Body.Close()
	if read != nil {
		read(resp.Body)
	}
	io.Copy(io.Discard, resp.Body) //nolint:errcheck
}

// newClient opens its 2,048 connections at once and never more (as
// TestOverload's client: dialing afresh under load overflows the
// listen backlog); a request waiting longer than 5 s fails.
func newClient(url string) *http.Client {
	const conns = 2048
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: conns, MaxConnsPerHost: conns}, Timeout: 5 * time.Second}
	var wg sync.WaitGroup
	for range conns {
		wg.Go(func() {
			req, _ := http.NewRequest("GET", url+"/nothing", nil)
			req.Header.Set(bypass, "1")
			if resp, err := c.Do(req); err == nil {
				io.Copy(io.Discard, resp.Body) //nolint:errcheck
				resp.Body.Close()
			}
		})
	}
	wg.Wait()
	return c
}

type outcome struct {
	crit, ok, shed bool
	units          int
	counted        int // units the server did after /mark (of a 200)
	latency        time.Duration
}

// send sends request i of the mix: 20 % dear independently of the level,
// CRITICAL for i%5 == 1.
func (s *server) send(i int, bypassed bool) outcome {
	path, level, units := "/cheap", "SHEDDABLE", 10
	if (i/5)%5 == 0 {
		path, units = "/dear", 50
	}
	if i%5 == 1 {
		level = "CRITICAL"
	}
	req, _ := http.NewRequest("GET", s.url+path, nil)
	req.Header.Set("X-Criticality", level)
	if bypassed {
		req.Header.Set(bypass, "1")
	} else if i%meterEvery == 3 {
		req.Header.Set(meterHeader, "1")
	}
	start := time.Now()
	resp, err := s.hc.Do(req)
	o := outcome{crit: level == "CRITICAL", units: units, latency: time.Since(start)}
	if err != nil {
		return o
	}
	io.Copy(io.Discard, resp.Body) //nolint:errcheck
	resp.Body.Close()
	o.ok, o.shed = resp.StatusCode == 200, resp.StatusCode == 503
	if o.ok {
		o.counted, _ = strconv.Atoi(resp.Header.Get(countedHeader))
	}
	return o
}

// capacity runs closed-loop load (8 clients, the peer bypassed) for d
// and returns the units done per server CPU-second.
func (s *server) capacity(d time.Duration) float64 {
	perCPU, _ := s.capacityUnits(d)
	return perCPU
}

// capacityUnits is capacity, and the units done.
func (s *server) capacityUnits(d time.Duration) (float64, int64) {
	u0, c0 := s.stats()
	start := time.Now()
	var wg sync.WaitGroup
	for c := range 8 {
		wg.Go(func() {
			for i := c; time.Since(start) < d; i += 8 {
				s.send(i, true)
			}
		})
	}
	wg.Wait()
	u1, c1 := s.stats()
	return float64(u1-u0) / (c1 - c0).Seconds(), u1 - u0
}

// capacityInstr is capacity with the server's instructions counted
// (perf.go): units per server CPU-second, and units per billion
// instructions (0 if they could not be counted).
func (s *server) capacityInstr(d time.Duration) (perCPU, perGInstr float64) {
	var units int64
	instr, err := counting(s.cmd.Process.Pid, func() { perCPU, units = s.capacityUnits(d) })
	if err != nil || instr <= 0 {
		noteInstrErr(err)
		return perCPU, 0
	}
	return perCPU, float64(units) / instr * 1e9
}

// noteInstrErr says once why instructions are not counted.
var noteInstrErr = func() func(error) {
	var once sync.Once
	return func(err error) {
		once.Do(func() { fmt.Fprintf(os.Stderr, "instructions not counted (perf): %v\n", err) })
	}
}()

const meanUnits = 0.8*10 + 0.2*50

func runOne(peer string, round int, d time.Duration) (result, error) {
	s, err := startServer(peer, round)
	if err != nil {
		return result{}, err
	}
	s.hc = newClient(s.url)
	s.ctl = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}, Timeout: 30 * time.Second}
	defer s.stop()
	s.capacity(500 * time.Millisecond) // warm up
	before, beforeI := s.capacityInstr(2 * time.Second)
	res, cpu := s.overload(3*before/meanUnits, d, time.Second)
	after, afterI := s.capacityInstr(1500 * time.Millisecond)
	res.perCPU = (before + after) / 2
	okUnits := res.okUnits
	r := result{perCPU: res.perCPU, goodput: 100 * res.okCounted / cpu.Seconds() / res.perCPU,
		goodputByAnswer: 100 * okUnits / cpu.Seconds() / res.perCPU,
		unanswered:      100 * max(0, res.serverUnits-res.okCounted) / max(1, res.serverUnits),
		underLoad:       100 * res.underLoad / res.perCPU}
	if beforeI > 0 && afterI > 0 && res.instr > 0 {
		r.perGInstr = (beforeI + afterI) / 2
		r.goodputInstr = 100 * res.okCounted / res.instr * 1e9 / r.perGInstr
	}
	var lat []time.Duration
	for _, o := range res.outcomes {
		r.n++
		if o.ok {
			r.ok++
			lat = append(lat, o.latency)
		}
		if o.shed {
			r.refused++
		}
		if o.crit {
			r.crit++
			if o.ok {
				r.critOK++
			}
		}
	}
	if len(lat) > 0 {
		slices.Sort(lat)
		r.p99 = lat[len(lat)*99/100]
	}
	if r.crit > 0 {
		r.critSuccess = 100 * float64(r.critOK) / float64(r.crit)
	}
	if r.refused > 0 {
		r.wastePerRefused = max(0, cpu.Seconds()-okUnits/res.perCPU) / float64(r.refused) * 1e6
	}
	m := res.meter
	if n := m.shedN + m.waitN; n > 0 {
		r.shedCPU = float64(m.shedNs+m.waitNs) / float64(n) / 1e3
		r.shedShare = 100 * r.shedCPU * float64(r.refused) / float64(cpu.Microseconds())
	}
	if m.shedN > 0 {
		r.shedAtOnceCPU = float64(m.shedNs) / float64(m.shedN) / 1e3
	}
	if m.waitN > 0 {
		r.shedWaitedCPU = float64(m.waitNs) / float64(m.waitN) / 1e3
	}
	r.shedMetered, r.shedWaited = int(m.shedN+m.waitN), int(m.waitN)
	if m.okUnits > 0 {
		r.okCPUPerUnit = float64(m.okNs) / float64(m.okUnits) / 1e3
		r.answeredCPU = 100 * res.okCounted * r.okCPUPerUnit / float64(cpu.Microseconds())
	}
	r.idle = float64(m.idle) / 10
	if m.limits != "- - - - - -" {
		r.limits = m.limits
	}
	return r, nil
}

type phase struct {
	outcomes    []outcome
	perCPU      float64
	serverUnits float64 // work the server did in the window (from the mark to the drain), answered or not
	okUnits     float64 // work answered 200 after warm, by the answer's time, whenever done
	okCounted   float64 // work done in the window and answered 200
	underLoad   float64 // work done (answered or not) per server CPU-second from the mark to the load's end
	instr       float64 // instructions the server retired from the mark to the drain's end (0: not counted)
	meter       meterReading
}

// meterReading is the server's /meter answer (meter.go).
type meterReading struct {
	okN, okNs, okUnits, shedN, shedNs, waitN, waitNs, otherN, otherNs int64
	idle                                                              int64 // ‰ of the processors' time, from the mark
	limits                                                            string
}

func (s *server) meter() meterReading {
	var m meterReading
	s.get("/meter", func(r io.Reader) {
		b, _ := io.ReadAll(r)
		f := strings.Fields(string(b))
		if len(f) < 10 {
			return
		}
		v := make([]int64, 10)
		for i := range v {
			v[i], _ = strconv.ParseInt(f[i], 10, 64)
		}
		m = meterReading{v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], strings.Join(f[10:], " ")}
	})
	return m
}

// overload offers open-loop load for d, at rps first, then every 100 ms
// at 3× capacity scaled by the CPU the server got over the last second;
// it records after warm and returns the outcomes and the server's CPU
// time over the recorded part (to the last answer).
func (s *server) overload(rps float64, d, warm time.Duration) (phase, time.Duration) {
	perCPU := rps / 3 // requests per server CPU-second at capacity
	var rate atomic.Uint64
	rate.Store(math.Float64bits(rps))
	var record atomic.Bool
	var okDone atomic.Int64    // units answered 200 since warm, by the answer's time
	var okCounted atomic.Int64 // units done after the mark, of answers 200
	var mu sync.Mutex
	var ph phase
	var reqs sync.WaitGroup
	done := make(chan struct{})
	var loop sync.WaitGroup
	loop.Go(func() {
		start, last, due, sent := time.Now(), time.Duration(0), 0.0, 0
		for {
			select {
			case <-done:
				return
			default:
			}
			el := time.Since(start)
			due += math.Float64frombits(rate.Load()) * (el - last).Seconds()
			last = el
			for ; float64(sent) < due; sent++ {
				i := sent
				reqs.Go(func() {
					rec := record.Load()
					o := s.send(i, false)
					if o.ok && record.Load() {
						okDone.Add(int64(o.units))
					}
					okCounted.Add(int64(o.counted))
					if rec {
						mu.Lock()
						ph.outcomes = append(ph.outcomes, o)
						mu.Unlock()
					}
				})
			}
			time.Sleep(time.Millisecond)
		}
	})
	type point struct{ at, cpu time.Duration }
	start := time.Now()
	_, c0 := s.stats()
	hist := []point{{0, c0}}
	var cpuAtWarm time.Duration
	pc, perr := startPerf(s.cmd.Process.Pid) // on at the mark, off when drained
	if perr != nil {
		noteInstrErr(perr)
	}
	for el := time.Duration(0); el < d; el = time.Since(start) {
		if cpuAtWarm == 0 && el >= warm {
			if pc != nil {
				if perr = pc.on(); perr != nil {
					noteInstrErr(perr)
				}
			}
			_, cpuAtWarm = s.stats()
			s.get("/mark", nil) // the server counts work from here
			record.Store(true)
		}
		time.Sleep(100 * time.Millisecond)
		_, now := s.stats()
		el := time.Since(start)
		hist = append(hist, point{el, now})
		old := hist[max(0, len(hist)-11)]
		rate.Store(math.Float64bits(3 * perCPU * (now - old.cpu).Seconds() / (el - old.at).Seconds()))
	}
	s.get("/endmark", nil) // the offered load ends
	_, cpuAtEnd, countedAtEnd := s.stats3()
	close(done)
	loop.Wait()
	reqs.Wait()
	_, cpu := s.drain()
	if pc != nil {
		if perr == nil {
			perr = pc.off()
		}
		n, err := pc.count()
		if perr == nil && err == nil {
			ph.instr = n
		} else {
			noteInstrErr(errors.Join(perr, err))
		}
	}
	_, _, counted := s.stats3()
	ph.serverUnits = float64(counted)
	ph.okUnits = float64(okDone.Load())
	ph.okCounted = float64(okCounted.Load())
	ph.underLoad = float64(countedAtEnd) / (cpuAtEnd - cpuAtWarm).Seconds()
	ph.meter = s.meter()
	return ph, cpu - cpuAtWarm
}

// drain waits until the server has finished the work it still holds
// (handlers of requests the client gave up on run to the end: that CPU
// is the peer's waste too) and returns its CPU time then: done when no
// unit completed over 300 ms, or after 30 s.
func (s *server) drain() (int64, time.Duration) {
	u, c := s.stats()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		time.Sleep(300 * time.Millisecond)
		u2, c2 := s.stats()
		if u2 == u {
			return u2, c2
		}
		u, c = u2, c2
	}
	return u, c
}
