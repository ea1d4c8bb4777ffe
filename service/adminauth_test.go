package service_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/floodgate/floodgate/service"
)

const adminToken = "3f9c2a7b1e6d4c8a9b0f5e2d7c1a6b3e" // 32 hex digits: 128 bits

// adminAuthFailures reads floodgate_admin_auth_failures_total{result}.
func adminAuthFailures(t *testing.T, m *service.Metrics, result string) float64 {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "floodgate_admin_auth_failures_total" {
			continue
		}
		for _, mm := range mf.GetMetric() {
			for _, lp := range mm.GetLabel() {
				if lp.GetName() == "result" && lp.GetValue() == result {
					return mm.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no floodgate_admin_auth_failures_total{result=%q} in the registry", result)
	return 0
}

// adminAs sends GET /v1/rules to h from remote with Authorization auth.
func adminAs(h http.Handler, remote, auth string) *httptest.ResponseRecorder {
	req := httptest.NewRequest("GET", "/v1/rules", nil)
	req.RemoteAddr = remote
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// Four thousand wrong tokens from one address: the first
// AdminFailureLimit are answered 401, every later one 429 with a
// Retry-After, and the metric counts both. The right token from another
// address still works; from the throttled address it waits as the
// guesses do (else a 200 among the 429s would tell a guess right), until
// the Retry-After has passed. A right token costs its address nothing.
func TestAdminWrongTokensAreThrottled(t *testing.T) {
	m := service.NewMetrics()
	e := newEnv(t, service.Options{Metrics: m}, dayRules)
	h := e.svc.AdminHandler(adminToken)
	const attacker, operator = "198.51.100.7:40000", "203.0.113.5:50000"

	// an operator's right tokens spend nothing of its address's allowance
	for range 3 * service.AdminFailureLimit {
		if rec := adminAs(h, operator, "Bearer "+adminToken); rec.Code != 200 {
			t.Fatalf("the right token: %d %s", rec.Code, rec.Body)
		}
	}
	codes := map[int]int{}
	var retry string
	for i := range 4000 {
		rec := adminAs(h, attacker, "Bearer guess"+strconv.Itoa(i))
		codes[rec.Code]++
		if rec.Code == http.StatusTooManyRequests {
			retry = rec.Header().Get("Retry-After")
		}
	}
	if codes[401] != service.AdminFailureLimit || codes[429] != 4000-service.AdminFailureLimit {
		t.Fatalf("4000 wrong tokens from one address: %v, want %d 401 then 429", codes, service.AdminFailureLimit)
	}
	if n, err := strconv.Atoi(retry); err != nil || n < 1 || n > int(service.AdminFailurePeriod/time.Second) {
		t.Fatalf("Retry-After %q on a 429, want whole seconds in [1, %d]", retry, int(service.AdminFailurePeriod/time.Second))
	}
	if got := adminAuthFailures(t, m, "bad_token"); got != float64(service.AdminFailureLimit) {
		t.Errorf("bad_token failures %v, want %d", got, service.AdminFailureLimit)
	}
	if got := adminAuthFailures(t, m, "throttled"); got != float64(4000-service.AdminFailureLimit) {
		t.Errorf("throttled failures %v, want %d", got, 4000-service.AdminFailureLimit)
	}

	// another address is not held back by the attacker's failures
	if rec := adminAs(h, operator, "Bearer "+adminToken); rec.Code != 200 {
		t.Fatalf("the right token from another address: %d %s", rec.Code, rec.Body)
	}
	// the throttled address is refused whatever its token, until it waited
	if rec := adminAs(h, attacker, "Bearer "+adminToken); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("the right token from the throttled address: %d, want 429", rec.Code)
	}
	n, _ := strconv.Atoi(retry)
	e.clk.Advance(time.Duration(n) * time.Second)
	if rec := adminAs(h, attacker, "Bearer "+adminToken); rec.Code != 200 {
		t.Fatalf("the right token from the throttled address after Retry-After: %d %s", rec.Code, rec.Body)
	}
	// after a whole period its allowance is back, all of it
	e.clk.Advance(service.AdminFailurePeriod)
	codes = map[int]int{}
	for range 2 * service.AdminFailureLimit {
		codes[adminAs(h, attacker, "Bearer wrong").Code]++
	}
	if codes[401] != service.AdminFailureLimit || codes[429] != service.AdminFailureLimit {
		t.Fatalf("wrong tokens a period later: %v, want %d 401 then 429", codes, service.AdminFailureLimit)
	}
}

// Wrong tokens sent at once from one address get no more than the
// allowance between them: each takes its share before its token is
// looked at, so none is compared beyond it.
func TestAdminWrongTokensThrottledConcurrently(t *testing.T) {
	m := service.NewMetrics()
	e := newEnv(t, service.Options{Metrics: m}, dayRules)
	h := e.svc.AdminHandler(adminToken)
	var mu sync.Mutex
	codes := map[int]int{}
	var wg sync.WaitGroup
	for range 400 {
		wg.Go(func() {
			c := adminAs(h, "198.51.100.7:1", "Bearer wrong").Code
			mu.Lock()
			codes[c]++
			mu.Unlock()
		})
	}
	wg.Wait()
	if codes[401] != service.AdminFailureLimit || codes[429] != 400-service.AdminFailureLimit {
		t.Fatalf("400 wrong tokens at once: %v, want exactly %d 401", codes, service.AdminFailureLimit)
	}
}

// Failures are counted per client network as the gate keys clients: an
// IPv4 address, an IPv6 /64 (one host holds a whole /64), an IPv4-mapped
// IPv6 address as its IPv4 address. A unix-socket client (no address) is
// one client.
func TestAdminThrottleGroupsAddresses(t *testing.T) {
	for _, c := range []struct {
		name, first, second string // first spends the allowance; then a wrong token from second
		same                bool
	}{
		{"same /64", "[2001:db8:1:2::1]:1", "[2001:db8:1:2:ffff::9]:2", true},
		{"other /64", "[2001:db8:1:2::1]:1", "[2001:db8:1:3::1]:1", false},
		{"IPv4-mapped", "192.0.2.1:1", "[::ffff:192.0.2.1]:2", true},
		{"other IPv4", "192.0.2.1:1", "192.0.2.2:1", false},
		{"unix sockets", "@", "", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, service.Options{}, dayRules)
			h := e.svc.AdminHandler(adminToken)
			for range service.AdminFailureLimit {
				if code := adminAs(h, c.first, "Bearer wrong").Code; code != 401 {
					t.Fatalf("a wrong token within the allowance: %d, want 401", code)
				}
			}
			want := 401
			if c.same {
				want = 429
			}
			if code := adminAs(h, c.second, "Bearer wrong").Code; code != want {
				t.Fatalf("a wrong token from %q after %q spent its allowance: %d, want %d", c.second, c.first, code, want)
			}
		})
	}
}

// The proxy guards its own admin routes (bans) and the service's with one
// throttle: failures on either count against the same allowance.
func TestAdminThrottleSharedAcrossRoutes(t *testing.T) {
	e := newEnv(t, service.Options{}, dayRules)
	admin := e.svc.AdminHandler(adminToken)
	bans := e.svc.RequireToken(adminToken, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	for i := range service.AdminFailureLimit {
		h := admin
		if i%2 == 1 {
			h = bans
		}
		if code := adminAs(h, "192.0.2.1:1", "Bearer wrong").Code; code != 401 {
			t.Fatalf("wrong token %d: %d, want 401", i, code)
		}
	}
	if code := adminAs(bans, "192.0.2.1:1", "Bearer wrong").Code; code != 429 {
		t.Fatalf("the next wrong token on the other route: %d, want 429", code)
	}
}
