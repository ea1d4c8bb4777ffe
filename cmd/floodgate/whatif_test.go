package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// The rules a running serve enforces in the what-if tests: 10 a day a user.
const whatIfLiveRules = `domain: wi
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 10}
`

// The rules posted: 4 a day a user, "vip" 2 a day in shadow mode.
const whatIfCandidateRules = `domain: wi
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 4}
  - key: user
    value: vip
    shadow_mode: true
    rate_limit: {unit: day, requests_per_unit: 2}
`

// whatIfTraffic is the generated traffic of the what-if tests, sent in
// order: a user's value and its hits.
type whatIfTraffic []struct {
	value string
	hits  uint32
}

func genWhatIfTraffic(seed uint64, n int) whatIfTraffic {
	rng := rand.New(rand.NewPCG(seed, 22))
	values := []string{"u0", "u1", "u2", "u3", "vip"}
	out := make(whatIfTraffic, n)
	for i := range out {
		out[i].value, out[i].hits = values[rng.IntN(len(values))], 1
		if rng.IntN(4) == 0 {
			out[i].hits = uint32(rng.IntN(3) + 2)
		}
	}
	return out
}

// ruleCounts is one rule's what-if counts.
type ruleCounts struct {
	Name          string `json:"name"`
	Matched       int64  `json:"matched"`
	Allowed       int64  `json:"allowed"`
	Refused       int64  `json:"refused"`
	ShadowRefused int64  `json:"shadow_refused"`
}

// replayFixed is the test's own replay of traffic through one fixed window
// (every request in one day): per rule, a counter per user, a request
// admitted while its hits fit (a refused one consumes nothing). rule says
// which rule a value falls under, its limit and whether it is in shadow
// mode. It returns the counts by rule name, and the requests refused.
func replayFixed(traffic whatIfTraffic, rule func(value string) (string, int64, bool)) (map[string]ruleCounts, int) {
	used := map[string]int64{}
	out := map[string]ruleCounts{}
	refused := 0
	for _, r := range traffic {
		name, limit, shadow := rule(r.value)
		c := out[name]
		c.Name = name
		c.Matched++
		switch {
		case used[r.value]+int64(r.hits) <= limit:
			used[r.value] += int64(r.hits)
			c.Allowed++
		case shadow:
			c.ShadowRefused++
		default:
			c.Refused++
			refused++
		}
		out[name] = c
	}
	return out, refused
}

func candidateRule(v string) (string, int64, bool) {
	if v == "vip" {
		return "wi.user_vip", 2, true
	}
	return "wi.user", 4, false
}

func liveRule(string) (string, int64, bool) { return "wi.user", 10, false }

// whatIfAnswer is the part of POST /v1/whatif's answer the tests read.
type whatIfAnswer struct {
	Window struct {
		Requests  int  `json:"requests"`
		Truncated bool `json:"truncated"`
		Complete  bool `json:"complete"`
	} `json:"window"`
	Candidate struct {
		RequestsRefused int          `json:"requests_refused"`
		Rules           []ruleCounts `json:"rules"`
	} `json:"candidate"`
	Current struct {
		RequestsRefused int          `json:"requests_refused"`
		Rules           []ruleCounts `json:"rules"`
	} `json:"current"`
}

func adminPost(t *testing.T, url, token, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// sendWhatIfTraffic sends traffic to s in order, through gRPC.
func sendWhatIfTraffic(t *testing.T, s *server, traffic whatIfTraffic) {
	t.Helper()
	for _, r := range traffic {
		req := &rlsv3.RateLimitRequest{Domain: "wi", Descriptors: []*rlcommon.RateLimitDescriptor{desc("user", r.value)}, HitsAddend: r.hits}
		if _, err := s.client.ShouldRateLimit(t.Context(), req); err != nil {
			t.Fatal(err)
		}
	}
}

// A running serve, driven through gRPC, answers POST /v1/whatif with the
// counts of a replay computed here by hand, for the rules posted and the
// live ones; the live keys are as they were after it; without the token
// it answers 401, and a rules file with an error 400 naming whatif.yaml's
// line.
func TestServeWhatIf(t *testing.T) {
	const token = "whatif-serve-token-0123456789abcdef"
	dir := t.TempDir()
	writeRules(t, dir, "wi.yaml", whatIfLiveRules)
	s := startServer(t, "--rules", dir, "--data", t.TempDir(), "--admin-token", token)
	clearOfWindowEnd(t, 24*time.Hour, time.Minute) // every request in one day's window
	day := time.Now().Truncate(24 * time.Hour)
	traffic := genWhatIfTraffic(1, 120)
	sendWhatIfTraffic(t, s, traffic)
	if !time.Now().Truncate(24 * time.Hour).Equal(day) {
		t.Fatal("the traffic crossed a day's end") // clearOfWindowEnd left a minute
	}
	inspect := func() string {
		var b strings.Builder
		for _, v := range []string{"u0", "u1", "u2", "u3", "vip"} {
			code, body := adminPost(t, "http://"+s.admin+"/v1/keys/inspect", token, `{"domain":"wi","entries":[{"key":"user","value":"`+v+`"}]}`)
			if code != 200 {
				t.Fatalf("inspect %s: %d %s", v, code, body)
			}
			var st struct {
				Allowed   bool  `json:"allowed"`
				Remaining int64 `json:"remaining"`
			}
			if err := json.Unmarshal([]byte(body), &st); err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&b, "%s: allowed %v, remaining %d\n", v, st.Allowed, st.Remaining)
		}
		return b.String()
	}
	before := inspect()

	code, body := adminPost(t, "http://"+s.admin+"/v1/whatif", token, whatIfCandidateRules)
	if code != 200 {
		t.Fatalf("what-if: %d %s", code, body)
	}
	var got whatIfAnswer
	if err := json.Unmarshal([]byte(body), &got); err != nil {
		t.Fatal(err)
	}
	if got.Window.Requests != len(traffic) || got.Window.Truncated || !got.Window.Complete {
		t.Fatalf("window: %+v, want %d requests", got.Window, len(traffic))
	}
	cand, candRefused := replayFixed(traffic, candidateRule)
	cur, curRefused := replayFixed(traffic, liveRule)
	compare := func(what string, rs []ruleCounts, want map[string]ruleCounts, refused, wantRefused int) {
		t.Helper()
		if len(rs) != len(want) || refused != wantRefused {
			t.Errorf("%s: %d rules, %d refused; want %d, %d: %s", what, len(rs), refused, len(want), wantRefused, body)
		}
		for _, r := range rs {
			if r != want[r.Name] {
				t.Errorf("%s: %+v, want %+v", what, r, want[r.Name])
			}
		}
	}
	compare("candidate", got.Candidate.Rules, cand, got.Candidate.RequestsRefused, candRefused)
	compare("current", got.Current.Rules, cur, got.Current.RequestsRefused, curRefused)
	if cand["wi.user"].Refused == cur["wi.user"].Refused || cand["wi.user_vip"].ShadowRefused == 0 {
		t.Fatalf("the traffic does not tell the rules apart: %+v %+v", cand, cur)
	}
	if after := inspect(); after != before {
		t.Errorf("the what-if changed live keys:\nbefore %s\nafter  %s", before, after)
	}

	if code, body := adminPost(t, "http://"+s.admin+"/v1/whatif", "", whatIfCandidateRules); code != 401 {
		t.Errorf("without the token: %d %s", code, body)
	}
	bad := strings.Replace(whatIfCandidateRules, "unit: day, requests_per_unit: 2", "unit: day, requests_per_unit: two", 1)
	if code, body := adminPost(t, "http://"+s.admin+"/v1/whatif", token, bad); code != 400 || !strings.Contains(body, "whatif.yaml:8") {
		t.Errorf("a bad file: %d %s", code, body)
	}
}

// serve --record-window 0 records nothing, and a what-if says so.
func TestServeWhatIfRecordingOff(t *testing.T) {
	dir := t.TempDir()
	writeRules(t, dir, "wi.yaml", whatIfLiveRules)
	s := startServer(t, "--rules", dir, "--data", t.TempDir(), "--record-window", "0")
	s.ask(t, "wi", desc("user", "a"))
	if code, body := adminPost(t, "http://"+s.admin+"/v1/whatif", "", whatIfCandidateRules); code != 409 {
		t.Errorf("recording off: %d %s", code, body)
	}
	for _, bad := range []string{"-1s", "2h"} {
		if _, err := serveFlags([]string{"--record-window", bad}, io.Discard); err == nil {
			t.Errorf("--record-window %s taken", bad)
		}
	}
}
