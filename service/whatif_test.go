package service_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/floodgate/floodgate/internal/refmodel"
	"github.com/floodgate/floodgate/service"
)

// The live rules of the what-if tests: users 10 a minute.
const whatIfLive = `domain: wi
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
`

// The candidate: users 4 a minute, and "vip" 2 a minute in shadow mode.
const whatIfCandidate = `domain: wi
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 4}
  - key: user
    value: vip
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
`

// whatIfCounts is one rule's counts as the test computes them.
type whatIfCounts struct{ Matched, Allowed, Refused, ShadowRefused int64 }

// fixedModel is the test's own replay of a fixed-window rule set: a
// counter per (rule, key, window), by hand.
type fixedModel struct {
	limit  func(value string) (rule string, limit int64, shadow bool)
	counts map[string]int64 // rule|value|window → count
	rules  map[string]*whatIfCounts
	refReq int // requests refused
	// window is a value's window (nil: a minute for every value).
	window func(value string) time.Duration
}

func newFixedModel(limit func(string) (string, int64, bool)) *fixedModel {
	return &fixedModel{limit: limit, counts: map[string]int64{}, rules: map[string]*whatIfCounts{}}
}

// add decides a request of value with hits at t (one-minute windows from
// the epoch; a refused request consumes nothing).
func (m *fixedModel) add(t time.Time, value string, hits int64) {
	rule, limit, shadow := m.limit(value)
	c := m.rules[rule]
	if c == nil {
		c = &whatIfCounts{}
		m.rules[rule] = c
	}
	c.Matched++
	w := time.Minute
	if m.window != nil {
		w = m.window(value)
	}
	k := fmt.Sprintf("%s|%s|%d", rule, value, t.UnixMicro()/w.Microseconds())
	switch {
	case m.counts[k]+hits <= limit:
		m.counts[k] += hits
		c.Allowed++
	case shadow:
		c.ShadowRefused++
	default:
		c.Refused++
		m.refReq++
	}
}

type sentReq struct {
	at    time.Time
	value string
	hits  int64
}

type whatIfRuleJSON struct {
	Name          string `json:"name"`
	File          string `json:"file"`
	Line          int    `json:"line"`
	Matched       int64  `json:"matched"`
	Allowed       int64  `json:"allowed"`
	Refused       int64  `json:"refused"`
	ShadowRefused int64  `json:"shadow_refused"`
}

type whatIfRunJSON struct {
	Loaded          bool             `json:"loaded"`
	RequestsRefused int              `json:"requests_refused"`
	Invalid         int              `json:"invalid"`
	Rules           []whatIfRuleJSON `json:"rules"`
}

type whatIfJSON struct {
	Domain string `json:"domain"`
	Window struct {
		From      time.Time `json:"from"`
		To        time.Time `json:"to"`
		Requests  int       `json:"requests"`
		Truncated bool      `json:"truncated"`
		Complete  bool      `json:"complete"`
		Replayed  int       `json:"replayed"`
	} `json:"window"`
	Candidate whatIfRunJSON `json:"candidate"`
	Current   whatIfRunJSON `json:"current"`
}

func postWhatIf(t *testing.T, url, token, query, body string) (int, string) {
	t.Helper()
	return adminCallAuth(t, url, token, "POST", "/v1/whatif"+query, body)
}

// The what-if's counts are those of a replay computed here by hand, for
// the posted rules and for the live ones, over traffic sent through real
// gRPC on the service's manual clock; a shorter ?minutes replays the
// newest requests alone, from a fresh state. And the live keys are as
// they were: nothing the replay decided was charged to them.
func TestWhatIfMatchesIndependentReplay(t *testing.T) {
	const token = "whatif-test-token-0123456789abcdef"
	metrics := service.NewMetrics()
	e := newEnv(t, service.Options{Record: service.RecordOptions{Window: 5 * time.Minute}, Metrics: metrics, RecordDecisions: true}, whatIfLive)
	client := rlsv3.NewRateLimitServiceClient(dialGRPC(t, e.serveGRPC(t)))
	admin := httptest.NewServer(e.svc.AdminHandler(token))
	t.Cleanup(admin.Close)

	rng := rand.New(rand.NewPCG(22, 7))
	values := []string{"u0", "u1", "u2", "vip"}
	var sent []sentReq
	start := e.clk.Now()
	for e.clk.Now().Sub(start) < 4*time.Minute {
		e.clk.Advance(time.Duration(rng.IntN(900)+100) * time.Millisecond)
		v, hits := values[rng.IntN(len(values))], int64(1)
		req := &rlsv3.RateLimitRequest{Domain: "wi", Descriptors: []*rlcommon.RateLimitDescriptor{d("user", v)}}
		if rng.IntN(5) == 0 {
			hits = int64(rng.IntN(3) + 2)
			req.HitsAddend = uint32(hits)
		}
		if _, err := client.ShouldRateLimit(t.Context(), req); err != nil {
			t.Fatal(err)
		}
		// another domain's requests are recorded, and not replayed
		if _, err := client.ShouldRateLimit(t.Context(), reqOf("other", d("user", v))); err != nil {
			t.Fatal(err)
		}
		sent = append(sent, sentReq{e.clk.Now(), v, hits})
	}
	live := func(keys ...string) map[string]string {
		out := map[string]string{}
		for _, v := range keys {
			_, body := adminCallAuth(t, admin.URL, token, "POST", "/v1/keys/inspect", `{"domain":"wi","entries":[{"key":"user","value":"`+v+`"}]}`)
			out[v] = body
		}
		return out
	}
	before := live(values...)
	metricsBefore := fmt.Sprint(gatherSeries(t, metrics, "floodgate_decisions_total"))

	for _, minutes := range []float64{5, 1.5} {
		t.Run(fmt.Sprint(minutes), func(t *testing.T) {
			from := e.clk.Now().Add(-time.Duration(minutes * float64(time.Minute)))
			cand := newFixedModel(func(v string) (string, int64, bool) {
				if v == "vip" {
					return "wi.user_vip", 2, true
				}
				return "wi.user", 4, false
			})
			cur := newFixedModel(func(string) (string, int64, bool) { return "wi.user", 10, false })
			n := 0
			for _, r := range sent {
				if r.at.Before(from) {
					continue
				}
				n++
				cand.add(r.at, r.value, r.hits)
				cur.add(r.at, r.value, r.hits)
			}
			q := ""
			if minutes != 5 {
				q = fmt.Sprintf("?minutes=%g", minutes)
			}
			code, body := postWhatIf(t, admin.URL, token, q, whatIfCandidate)
			if code != 200 {
				t.Fatalf("what-if: %d %s", code, body)
			}
			var got whatIfJSON
			if err := json.Unmarshal([]byte(body), &got); err != nil {
				t.Fatal(err)
			}
			if got.Window.Requests != n || got.Window.Replayed != n || !got.Window.Complete || got.Window.Truncated {
				t.Fatalf("window: %+v, want %d requests replayed whole", got.Window, n)
			}
			if !got.Window.From.Equal(from) || !got.Window.To.Equal(e.clk.Now()) {
				t.Errorf("window %v to %v, want %v to %v", got.Window.From, got.Window.To, from, e.clk.Now())
			}
			check := func(what string, run whatIfRunJSON, m *fixedModel, names ...string) {
				t.Helper()
				if len(run.Rules) != len(names) {
					t.Fatalf("%s: %d rules, want %d: %s", what, len(run.Rules), len(names), body)
				}
				for i, name := range names {
					r, want := run.Rules[i], m.rules[name]
					gotC := whatIfCounts{r.Matched, r.Allowed, r.Refused, r.ShadowRefused}
					if r.Name != name || gotC != *want {
						t.Errorf("%s: rule %d %q: %+v, want %q %+v", what, i, r.Name, gotC, name, *want)
					}
				}
				if run.RequestsRefused != m.refReq {
					t.Errorf("%s: %d requests refused, want %d", what, run.RequestsRefused, m.refReq)
				}
			}
			check("candidate", got.Candidate, cand, "wi.user", "wi.user_vip")
			check("current", got.Current, cur, "wi.user")
			if got.Candidate.Rules[0].File != service.WhatIfFile || got.Candidate.Rules[1].Line != 8 {
				t.Errorf("where: %+v", got.Candidate.Rules)
			}
			if cand.rules["wi.user"].Refused == 0 || cand.rules["wi.user_vip"].ShadowRefused == 0 || cur.rules["wi.user"].Refused == cand.rules["wi.user"].Refused {
				t.Fatalf("the traffic does not tell the rule sets apart: %+v %+v", cand.rules, cur.rules)
			}
		})
	}
	// the candidate's limits have the live ones' names (domain and path):
	// a replay on the live store would have charged these keys
	if after := live(values...); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("the what-if changed live keys:\nbefore %v\nafter  %v", before, after)
	}
	// nor counted its decisions as the service's
	if after := fmt.Sprint(gatherSeries(t, metrics, "floodgate_decisions_total")); after != metricsBefore {
		t.Errorf("the what-if changed the decisions metric:\nbefore %s\nafter  %s", metricsBefore, after)
	}
}

// What a what-if refuses: a rules file with an error (400, naming
// whatif.yaml:line, nothing replayed), minutes out of range, a call
// without the token, and any call when nothing is recorded.
func TestWhatIfRefusesBadInput(t *testing.T) {
	const token = "whatif-test-token-0123456789abcdef"
	e := newEnv(t, service.Options{Record: service.RecordOptions{Window: 2 * time.Minute}}, whatIfLive)
	admin := httptest.NewServer(e.svc.AdminHandler(token))
	t.Cleanup(admin.Close)
	e.ask(t, reqOf("wi", d("user", "a")))

	code, body := postWhatIf(t, admin.URL, token, "", "domain: wi\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 4}\n")
	var bad struct {
		Error  string `json:"error"`
		Errors []struct {
			Line int    `json:"line"`
			Text string `json:"text"`
		} `json:"errors"`
	}
	if err := json.Unmarshal([]byte(body), &bad); err != nil || code != 400 || len(bad.Errors) != 1 || bad.Errors[0].Line != 4 ||
		!strings.HasPrefix(bad.Errors[0].Text, service.WhatIfFile+":4: ") || !strings.Contains(bad.Error, "fortnight") {
		t.Errorf("a bad unit: %d %s", code, body)
	}
	if code, body := postWhatIf(t, admin.URL, token, "", "domain: [\n"); code != 400 || !strings.Contains(body, service.WhatIfFile+":") {
		t.Errorf("bad YAML: %d %s", code, body)
	}
	for _, body := range []string{"", "domain: wi\ndescriptors: 7\n", "\x00\x01"} {
		if code, out := postWhatIf(t, admin.URL, token, "", body); code != 400 || !strings.Contains(out, service.WhatIfFile) {
			t.Errorf("body %q: %d %s", body, code, out)
		}
	}
	for _, q := range []string{"?minutes=0", "?minutes=-1", "?minutes=2.5", "?minutes=x", "?minutes=NaN"} {
		if code, body := postWhatIf(t, admin.URL, token, q, whatIfCandidate); code != 400 || !strings.Contains(body, "minutes") {
			t.Errorf("%s: %d %s", q, code, body)
		}
	}
	for _, tok := range []string{"", "wrong-token-0123456789abcdef0123"} {
		if code, body := postWhatIf(t, admin.URL, tok, "", whatIfCandidate); code != 401 {
			t.Errorf("token %q: %d %s", tok, code, body)
		}
	}
	if code, body := postWhatIf(t, admin.URL, token, "?minutes=2", whatIfCandidate); code != 200 || !strings.Contains(body, `"requests": 1`) {
		t.Errorf("the right token: %d %s", code, body)
	}

	off := newEnv(t, service.Options{}, whatIfLive)
	offAdmin := httptest.NewServer(off.svc.AdminHandler(""))
	t.Cleanup(offAdmin.Close)
	off.ask(t, reqOf("wi", d("user", "a")))
	if code, body := postWhatIf(t, offAdmin.URL, "", "", whatIfCandidate); code != 409 || !strings.Contains(body, "records no requests") {
		t.Errorf("recording off: %d %s", code, body)
	}
}

// The recorder's caps keep the newest requests, and the answer says the
// window was cut and from when it is whole; requests older than the
// window are forgotten.
func TestWhatIfRecorderCaps(t *testing.T) {
	e := newEnv(t, service.Options{Record: service.RecordOptions{Window: time.Minute, MaxEntries: 10}}, whatIfLive)
	admin := httptest.NewServer(e.svc.AdminHandler(""))
	t.Cleanup(admin.Close)
	for range 25 {
		e.clk.Advance(time.Second)
		e.ask(t, reqOf("wi", d("user", "a")))
	}
	var got struct {
		Window struct {
			Requests   int       `json:"requests"`
			Truncated  bool      `json:"truncated"`
			CoversFrom time.Time `json:"covers_from"`
		} `json:"window"`
		Candidate whatIfRunJSON `json:"candidate"`
		Notes     []string      `json:"notes"`
	}
	_, body := postWhatIf(t, admin.URL, "", "", whatIfCandidate)
	if err := json.Unmarshal([]byte(body), &got); err != nil {
		t.Fatal(err)
	}
	// the 10 newest: the 16th to the 25th second; the 15th was dropped
	if got.Window.Requests != 10 || !got.Window.Truncated || !got.Window.CoversFrom.Equal(e.clk.Now().Add(-10*time.Second+time.Microsecond)) || len(got.Notes) == 0 {
		t.Fatalf("capped: %s", body)
	}
	// 10 requests over two minutes' windows at 4 a minute
	if r := got.Candidate.Rules[0]; r.Matched != 10 || r.Allowed+r.Refused != 10 {
		t.Errorf("capped counts: %+v", r)
	}
	// two minutes later the recording holds none of them; a request
	// refused as malformed (too many entries) takes no room
	e.clk.Advance(2 * time.Minute)
	e.ask(t, reqOf("wi", d("user", "b")))
	var many []string
	for i := range service.MaxEntries + 1 {
		many = append(many, fmt.Sprint("k", i), "v")
	}
	if _, err := e.svc.ShouldRateLimit(t.Context(), reqOf("wi", d(many...))); err == nil {
		t.Fatal("33 entries taken")
	}
	_, body = postWhatIf(t, admin.URL, "", "", whatIfCandidate)
	if err := json.Unmarshal([]byte(body), &got); err != nil || got.Window.Requests != 1 || got.Window.Truncated {
		t.Errorf("after the window: %v %s", err, body)
	}
}

// The byte cap binds too: long values fill it before the entry cap.
func TestWhatIfRecorderByteCap(t *testing.T) {
	e := newEnv(t, service.Options{Record: service.RecordOptions{Window: time.Minute, MaxBytes: 8 << 10}}, whatIfLive)
	admin := httptest.NewServer(e.svc.AdminHandler(""))
	t.Cleanup(admin.Close)
	long := strings.Repeat("v", 1000)
	for i := range 100 {
		e.clk.Advance(time.Millisecond)
		e.ask(t, reqOf("wi", d("user", fmt.Sprint(i, long))))
	}
	var got whatIfJSON
	_, body := postWhatIf(t, admin.URL, "", "", whatIfCandidate)
	if err := json.Unmarshal([]byte(body), &got); err != nil {
		t.Fatal(err)
	}
	// each request holds over 1,000 bytes: at most 8 of them fit
	if n := got.Window.Requests; n < 1 || n > 8 || !got.Window.Truncated || got.Candidate.Rules[0].Matched != int64(n) {
		t.Errorf("byte cap: %s", body)
	}
}

// A replay that runs out of its time (the admin timeout) stops, and says
// so: the counts are of the requests replayed.
func TestWhatIfStopsAtTheAdminTimeout(t *testing.T) {
	e := newEnv(t, service.Options{Record: service.RecordOptions{Window: time.Minute}}, whatIfLive)
	for range 5 {
		e.ask(t, reqOf("wi", d("user", "a")))
	}
	// the call's time is up before the replay starts: a context already
	// ended, as the admin timeout's would be (no timer to wait for)
	ctx, cancel := context.WithDeadline(t.Context(), time.Unix(0, 0))
	defer cancel()
	w := httptest.NewRecorder()
	e.svc.AdminHandler("").ServeHTTP(w, httptest.NewRequest("POST", "/v1/whatif", strings.NewReader(whatIfCandidate)).WithContext(ctx))
	body := w.Body.String()
	if w.Code != 200 || !strings.Contains(body, `"complete": false`) || !strings.Contains(body, `"replayed": 0`) || !strings.Contains(body, "ran out of time") {
		t.Errorf("%d %s", w.Code, body)
	}
}

// A token bucket refills by the microsecond: the what-if's counts are
// those of internal/refmodel's bucket (exact rationals, written apart from
// the engine) fed the requests at the times they were sent, which holds
// only if the replay decides each request at its recorded time.
func TestWhatIfTokenBucketMatchesRefModel(t *testing.T) {
	e := newEnv(t, service.Options{Record: service.RecordOptions{Window: 5 * time.Minute}}, whatIfLive)
	client := rlsv3.NewRateLimitServiceClient(dialGRPC(t, e.serveGRPC(t)))
	admin := httptest.NewServer(e.svc.AdminHandler(""))
	t.Cleanup(admin.Close)
	const bucket = `domain: wi
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 30, burst: 5, algorithm: token_bucket}
`
	spec := []refmodel.Spec{{Kind: refmodel.TokenBucket, Limit: 30, Period: time.Minute.Microseconds(), Burst: 5}}
	keys := map[string]*refmodel.Key{}
	var want whatIfCounts
	rng := rand.New(rand.NewPCG(22, 9))
	for range 400 {
		e.clk.Advance(time.Duration(rng.IntN(4000)+1) * time.Millisecond / 7)
		v, hits := fmt.Sprint("u", rng.IntN(3)), int64(rng.IntN(3)+1)
		req := &rlsv3.RateLimitRequest{Domain: "wi", Descriptors: []*rlcommon.RateLimitDescriptor{d("user", v)}, HitsAddend: uint32(hits)}
		if _, err := client.ShouldRateLimit(t.Context(), req); err != nil {
			t.Fatal(err)
		}
		if keys[v] == nil {
			keys[v] = refmodel.NewKey(spec)
		}
		want.Matched++
		if keys[v].Do(e.clk.NowMicro(), refmodel.Allow, hits, 0, 0).Allowed {
			want.Allowed++
		} else {
			want.Refused++
		}
	}
	code, body := postWhatIf(t, admin.URL, "", "", bucket)
	var got whatIfJSON
	if err := json.Unmarshal([]byte(body), &got); err != nil || code != 200 {
		t.Fatalf("%d %v %s", code, err, body)
	}
	r := got.Candidate.Rules[0]
	if g := (whatIfCounts{r.Matched, r.Allowed, r.Refused, r.ShadowRefused}); g != want || got.Candidate.RequestsRefused != int(want.Refused) {
		t.Errorf("token bucket: %+v (%d requests refused), want %+v", g, got.Candidate.RequestsRefused, want)
	}
	if want.Refused == 0 || want.Allowed == 0 {
		t.Fatalf("the traffic tests nothing: %+v", want)
	}
}

// Requests through /json are recorded as through gRPC; a malformed one
// (an empty entry key) is replayed as ShouldRateLimit answers it, refused,
// and counted invalid in both replays, never decided.
func TestWhatIfRecordsJSONAndCountsInvalid(t *testing.T) {
	e := newEnv(t, service.Options{Record: service.RecordOptions{Window: time.Minute}}, whatIfLive)
	admin := httptest.NewServer(e.svc.AdminHandler(""))
	t.Cleanup(admin.Close)
	api := httptest.NewServer(e.svc.HTTPHandler(nil, nil))
	t.Cleanup(api.Close)
	for _, body := range []string{
		`{"domain":"wi","descriptors":[{"entries":[{"key":"user","value":"j"}]}]}`,
		`{"domain":"wi","descriptors":[{"entries":[{"key":"","value":"j"}]}]}`,
	} {
		resp, err := http.Post(api.URL+"/json", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	_, body := postWhatIf(t, admin.URL, "", "", whatIfCandidate)
	var got whatIfJSON
	if err := json.Unmarshal([]byte(body), &got); err != nil {
		t.Fatal(err)
	}
	if got.Window.Requests != 2 || got.Candidate.Invalid != 1 || got.Current.Invalid != 1 ||
		got.Candidate.Rules[0].Matched != 1 || got.Current.Rules[0].Matched != 1 {
		t.Errorf("%s", body)
	}
}
