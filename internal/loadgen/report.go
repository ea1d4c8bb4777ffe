package loadgen

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
)

// Result is the outcome of one run; it is also the --json output.
type Result struct {
	Mode        string   `json:"mode"` // "closed" or "open"
	Addr        string   `json:"addr"`
	Conns       int      `json:"conns"`
	Concurrency int      `json:"concurrency,omitempty"` // closed loop
	Rate        float64  `json:"rate,omitempty"`        // open loop, offered requests/s
	Domain      string   `json:"domain"`
	Descriptors []string `json:"descriptors"`
	Keys        int      `json:"keys"`
	Hits        uint32   `json:"hits"`

	WarmupSeconds   float64 `json:"warmup_s"`
	DurationSeconds float64 `json:"duration_s"` // measured phase as run (shorter if interrupted)
	Interrupted     bool    `json:"interrupted,omitempty"`

	// Requests counts the requests of the measured phase (sent in it
	// closed-loop, due in it open-loop) that were answered or failed.
	Requests   uint64            `json:"requests"`
	RPS        float64           `json:"requests_per_s"`
	OK         uint64            `json:"ok"`
	OverLimit  uint64            `json:"over_limit"`
	Unknown    uint64            `json:"unknown"` // answered with overall_code UNKNOWN
	Errors     uint64            `json:"errors"`
	ErrorCodes map[string]uint64 `json:"error_codes,omitempty"`

	Latency Latency     `json:"latency_us"`
	Open    *OpenResult `json:"open_loop,omitempty"`

	ServerCPU *CPUResult `json:"server_cpu,omitempty"`
	StoreCPU  *CPUResult `json:"store_cpu,omitempty"`  // --store-pid
	ClientCPU *CPUResult `json:"client_cpu,omitempty"` // this load generator

	// LatencyHist holds every latency of the measured phase.
	LatencyHist *Histogram `json:"-"`
	// SendLagHist (open loop) holds how late each request went out.
	SendLagHist *Histogram `json:"-"`
}

// Latency is a latency summary in microseconds.
type Latency struct {
	Min  float64 `json:"min"`
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	P999 float64 `json:"p999"`
	Max  float64 `json:"max"`
}

func summarize(h *Histogram) Latency {
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
	return Latency{
		Min: us(h.Min()), Mean: us(h.Mean()),
		P50: us(h.Quantile(0.5)), P90: us(h.Quantile(0.9)), P99: us(h.Quantile(0.99)), P999: us(h.Quantile(0.999)),
		Max: us(h.Max()),
	}
}

// OpenResult is what the open loop adds.
type OpenResult struct {
	Intended        uint64  `json:"intended"` // requests due in the measured phase
	Sent            uint64  `json:"sent"`     // of which sent
	Unsent          uint64  `json:"unsent"`   // never sent: the backlog had not cleared
	Late            uint64  `json:"late"`     // sent more than LateThresholdUS after their due time
	LateThresholdUS float64 `json:"late_threshold_us"`
	SendLag         Latency `json:"send_lag_us"` // due time to actual send
	PeakInFlight    int64   `json:"peak_in_flight"`
	Workers         int64   `json:"workers"`
	MaxInFlight     int     `json:"max_in_flight"`
}

// CPUResult is the CPU time a process used during the measured phase.
type CPUResult struct {
	PID           int     `json:"pid,omitempty"`
	Seconds       float64 `json:"cpu_s"`
	Cores         float64 `json:"cores"`           // CPU seconds per wall second
	USPerDecision float64 `json:"us_per_decision"` // per answered request (ok, over limit or unknown)
	USPerRequest  float64 `json:"us_per_request"`  // per request, errors included
}

func newCPUResult(pid int, cpu, wall time.Duration, decisions, requests uint64) *CPUResult {
	c := &CPUResult{PID: pid, Seconds: cpu.Seconds()}
	if wall > 0 {
		c.Cores = cpu.Seconds() / wall.Seconds()
	}
	if decisions > 0 {
		c.USPerDecision = float64(cpu.Nanoseconds()) / 1e3 / float64(decisions)
	}
	if requests > 0 {
		c.USPerRequest = float64(cpu.Nanoseconds()) / 1e3 / float64(requests)
	}
	return c
}

func (r *run) result(wall time.Duration, interrupted bool) *Result {
	cfg := r.cfg
	res := &Result{
		Mode: "closed", Addr: cfg.Addr, Conns: cfg.Conns, Domain: cfg.Domain, Keys: cfg.Keys, Hits: cfg.Hits,
		WarmupSeconds: cfg.Warmup.Seconds(), DurationSeconds: wall.Seconds(), Interrupted: interrupted,
		OK: r.win.ok.Load(), OverLimit: r.win.over.Load(), Unknown: r.win.unknown.Load(), Errors: r.win.errs.Load(),
		LatencyHist: r.win.lat,
	}
	for _, d := range cfg.Descriptors {
		res.Descriptors = append(res.Descriptors, d.String())
	}
	res.Requests = res.OK + res.OverLimit + res.Unknown + res.Errors
	if wall > 0 {
		res.RPS = float64(res.Requests) / wall.Seconds()
	}
	for c := range r.win.codes {
		if n := r.win.codes[c].Load(); n > 0 {
			if res.ErrorCodes == nil {
				res.ErrorCodes = map[string]uint64{}
			}
			res.ErrorCodes[codes.Code(c).String()] = n
		}
	}
	res.Latency = summarize(r.win.lat)
	if cfg.Rate > 0 {
		res.Mode = "open"
		res.Rate = cfg.Rate
		sent := r.sent.Load()
		res.Open = &OpenResult{
			Intended: r.intendedWin, Sent: sent, Late: r.late.Load(),
			LateThresholdUS: float64(cfg.LateThreshold.Nanoseconds()) / 1e3,
			SendLag:         summarize(r.sendLag), PeakInFlight: r.peakInFlight.Load(),
			Workers: r.workers.Load(), MaxInFlight: cfg.MaxInFlight,
		}
		if r.intendedWin > sent {
			res.Open.Unsent = r.intendedWin - sent
		}
		res.SendLagHist = r.sendLag
	} else {
		res.Concurrency = cfg.Concurrency
	}
	return res
}

// WriteJSON writes the result as indented JSON.
func (res *Result) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(res)
}

// WriteText writes the human-readable summary.
func (res *Result) WriteText(w io.Writer) error {
	var b strings.Builder
	res.textSetup(&b)
	res.textCounts(&b)
	fmt.Fprintf(&b, "latency      %s\n", latencyLine(res.Latency))
	if o := res.Open; o != nil {
		fmt.Fprintf(&b, "schedule     %s due, %s sent, %s late (> %s), %s unsent; peak %d in flight (%d workers, cap %d)\n",
			num(float64(o.Intended)), num(float64(o.Sent)), num(float64(o.Late)),
			fmtDur(time.Duration(o.LateThresholdUS*1e3)), num(float64(o.Unsent)), o.PeakInFlight, o.Workers, o.MaxInFlight)
		fmt.Fprintf(&b, "send lag     %s\n", latencyLine(o.SendLag))
	}
	if c := res.ServerCPU; c != nil {
		fmt.Fprintf(&b, "server cpu   pid %d: %.2fs (%.2f cores), %.2f µs/decision\n", c.PID, c.Seconds, c.Cores, c.USPerDecision)
	}
	if c := res.StoreCPU; c != nil {
		fmt.Fprintf(&b, "store cpu    pid %d: %.2fs (%.2f cores), %.2f µs/decision\n", c.PID, c.Seconds, c.Cores, c.USPerDecision)
	}
	if c := res.ClientCPU; c != nil {
		fmt.Fprintf(&b, "client cpu   %.2fs (%.2f cores), %.2f µs/request\n", c.Seconds, c.Cores, c.USPerRequest)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// textSetup writes the summary's first lines: the load and what it asked.
func (res *Result) textSetup(b *strings.Builder) {
	if res.Mode == "open" {
		fmt.Fprintf(b, "open loop at %s req/s", num(res.Rate))
	} else {
		fmt.Fprintf(b, "closed loop, %d callers", res.Concurrency)
	}
	fmt.Fprintf(b, " on %d connection%s to %s: %.3gs measured after %.3gs warmup",
		res.Conns, plural(res.Conns), res.Addr, res.DurationSeconds, res.WarmupSeconds)
	if res.Interrupted {
		b.WriteString(" (interrupted)")
	}
	hits := "hits_addend unset"
	if res.Hits > 0 {
		hits = fmt.Sprintf("hits %d", res.Hits)
	}
	fmt.Fprintf(b, "\ndomain %q, descriptors %s, %d key%s, %s\n\n",
		res.Domain, strings.Join(res.Descriptors, " | "), res.Keys, plural(res.Keys), hits)
}

// textCounts writes the requests by outcome, errors by code.
func (res *Result) textCounts(b *strings.Builder) {
	fmt.Fprintf(b, "requests     %s  (%s/s)\n", num(float64(res.Requests)), num(res.RPS))
	fmt.Fprintf(b, "  ok         %s\n", num(float64(res.OK)))
	fmt.Fprintf(b, "  over limit %s\n", num(float64(res.OverLimit)))
	if res.Unknown > 0 {
		fmt.Fprintf(b, "  unknown    %s\n", num(float64(res.Unknown)))
	}
	fmt.Fprintf(b, "  errors     %s", num(float64(res.Errors)))
	if len(res.ErrorCodes) > 0 {
		var parts []string
		for c := range res.ErrorCodes {
			parts = append(parts, fmt.Sprintf("%s %d", c, res.ErrorCodes[c]))
		}
		slices.Sort(parts)
		fmt.Fprintf(b, "  (%s)", strings.Join(parts, ", "))
	}
	b.WriteString("\n")
}

func latencyLine(l Latency) string {
	d := func(us float64) string { return fmtDur(time.Duration(us * 1e3)) }
	return fmt.Sprintf("p50 %s  p90 %s  p99 %s  p99.9 %s  max %s  (min %s, mean %s)",
		d(l.P50), d(l.P90), d(l.P99), d(l.P999), d(l.Max), d(l.Min), d(l.Mean))
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// num formats a count or rate with thousands separators (one decimal for
// non-integers below 100).
func num(f float64) string {
	if f != float64(int64(f)) && f < 100 {
		return fmt.Sprintf("%.1f", f)
	}
	s := fmt.Sprintf("%.0f", f)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// fmtDur prints a latency with 3 significant digits in a fitting unit.
func fmtDur(d time.Duration) string {
	switch {
	case d < time.Microsecond:
		return fmt.Sprintf("%dns", d.Nanoseconds())
	case d < time.Millisecond:
		return sig3(float64(d.Nanoseconds())/1e3) + "µs"
	case d < time.Second:
		return sig3(float64(d.Nanoseconds())/1e6) + "ms"
	default:
		return sig3(d.Seconds()) + "s"
	}
}

func sig3(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}
