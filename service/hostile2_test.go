package service_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/floodgate/floodgate/service"
)

// A value_to_metric value is as long as a client makes it; its per-value
// series are kept to MaxKeyBytes, as its store key is, and distinct long
// values stay distinct. The Space-Saving summary holds 400 values a rule:
// a 900 KiB value each held 360 MB, and every scrape wrote 100 of them
// out twice (110 MB for 60 values, seen on `floodgate serve`).
func TestValueToMetricLabelIsBounded(t *testing.T) {
	m := service.NewMetrics()
	file := "domain: v\ndescriptors:\n  - key: route\n    value_to_metric: true\n    rate_limit: {unit: hour, requests_per_unit: 100}\n"
	e := newEnv(t, service.Options{Metrics: m}, file)
	long := strings.Repeat("r", 200<<10)
	for _, v := range []string{long + "1", long + "2", long + "2", "short"} {
		e.ask(t, &rlsv3.RateLimitRequest{Domain: "v", Descriptors: []*rlcommon.RateLimitDescriptor{d("route", v)}})
	}
	got := gatherSeries(t, m, "floodgate_top_value_decisions")
	values := map[string]float64{}
	for series, n := range got {
		if !strings.Contains(series, "outcome=ok") {
			continue
		}
		_, v, _ := strings.Cut(series, ",value=")
		if len(v) > service.MaxKeyBytes {
			t.Errorf("a value label of %d bytes; want at most %d", len(v), service.MaxKeyBytes)
		}
		values[v] = n
	}
	if len(values) != 4 || values["v.route_short"] != 1 || values["other"] != 0 {
		t.Errorf("want the three values and other, each counted apart: %v", values)
	}
	for v, n := range values {
		if strings.HasPrefix(v, "v.route_rrr") && n != 1 && n != 2 {
			t.Errorf("%.20s…: %v decisions", v, n)
		}
	}
}

// One gRPC connection carries at most MaxConcurrentStreams calls at once:
// the server says so in its SETTINGS and refuses the streams beyond. A
// client's streams that send their headers and no message otherwise each
// held a goroutine until it hung up (100,000 of them on one connection:
// 100,000 goroutines and 1.1 GB, on `floodgate serve`).
func TestGRPCStreamsPerConnectionAreBounded(t *testing.T) {
	e := newEnv(t, service.Options{}, diffRules)
	c, err := net.Dial("tcp", e.serveGRPC(t))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(c, c)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	// the server's SETTINGS come first
	f, err := fr.ReadFrame()
	if err != nil {
		t.Fatal(err)
	}
	sf, ok := f.(*http2.SettingsFrame)
	if !ok {
		t.Fatalf("first frame %v, want SETTINGS", f)
	}
	if v, ok := sf.Value(http2.SettingMaxConcurrentStreams); !ok || v != service.MaxConcurrentStreams {
		t.Fatalf("SETTINGS_MAX_CONCURRENT_STREAMS %d (sent: %v), want %d", v, ok, service.MaxConcurrentStreams)
	}
	if err := fr.WriteSettingsAck(); err != nil {
		t.Fatal(err)
	}
	// a hostile client ignores it: its streams beyond are refused
	const extra = 20
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for i := range service.MaxConcurrentStreams + extra {
		hb.Reset()
		for _, kv := range [][2]string{{":method", "POST"}, {":scheme", "http"},
			{":path", "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"},
			{":authority", "x"}, {"content-type", "application/grpc"}, {"te", "trailers"}} {
			enc.WriteField(hpack.HeaderField{Name: kv[0], Value: kv[1]})
		}
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: uint32(2*i + 1), BlockFragment: hb.Bytes(), EndHeaders: true}); err != nil {
			t.Fatal(err)
		}
	}
	refused := 0
	for refused < extra {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("after %d refused streams: %v; want %d streams beyond %d refused", refused, err, extra, service.MaxConcurrentStreams)
		}
		if r, ok := f.(*http2.RSTStreamFrame); ok {
			if r.ErrCode != http2.ErrCodeRefusedStream || r.StreamID <= 2*service.MaxConcurrentStreams {
				t.Fatalf("RST_STREAM %v of stream %d; want REFUSED_STREAM beyond the first %d", r.ErrCode, r.StreamID, service.MaxConcurrentStreams)
			}
			refused++
		}
	}
}

// jsonCall POSTs body to the handler's /json and returns the status and
// the decoded response (or error body).
func jsonCall(t *testing.T, url string, method string, body []byte) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url+"/json", bytes.NewReader(body))
	resp, err := (&http.Client{Timeout: 20 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	b.ReadFrom(resp.Body)
	return resp.StatusCode, b.String()
}

// A /json body whose value holds bytes that are not UTF-8 (a client's
// header copied as it is, by a client that writes its JSON by hand) is
// decided as over gRPC, its bytes escaped \xNN, instead of failing with 400
// (where a caller failing open lets the request through every limit).
func TestJSONInvalidUTF8ValueIsLimited(t *testing.T) {
	e := newEnv(t, service.Options{}, diffRules)
	srv := httptest.NewServer(e.svc.HTTPHandler(nil, nil))
	t.Cleanup(srv.Close)
	body := func(value string) []byte {
		return []byte(`{"domain":"t","descriptors":[{"entries":[{"key":"user","value":"` + value + `"}]}]}`)
	}
	for i := 1; i <= 6; i++ {
		want := http.StatusOK
		if i == 6 {
			want = http.StatusTooManyRequests // 5 a minute
		}
		if code, b := jsonCall(t, srv.URL, "POST", body("\xff\xfeA")); code != want {
			t.Fatalf("request %d with an invalid UTF-8 value: %d %s, want %d", i, code, b, want)
		}
	}
	if code, b := jsonCall(t, srv.URL, "POST", body("\xfe\xffA")); code != 200 || !strings.Contains(b, `"limitRemaining":4`) {
		t.Fatalf("another invalid value: %d %s, want a limit of its own", code, b)
	}
	// the same key as the gRPC codec gives it: the escape spelt out
	// (TestInvalidUTF8ValueIsLimited) shares its counter
	if code, b := jsonCall(t, srv.URL, "POST", body(`\\xfe\\xffA`)); code != 200 || !strings.Contains(b, `"limitRemaining":3`) {
		t.Fatalf("the escaped spelling: %d %s, want the counter of the raw bytes", code, b)
	}
	// bytes outside a string are still malformed JSON
	if code, b := jsonCall(t, srv.URL, "POST", []byte("{\xff}")); code != 400 {
		t.Fatalf("invalid bytes outside a string: %d %s, want 400", code, b)
	}
}

// A /json call with no body (a GET, a probe) is told what to send, not
// "unexpected token".
func TestJSONEmptyBodyIsExplained(t *testing.T) {
	e := newEnv(t, service.Options{}, diffRules)
	srv := httptest.NewServer(e.svc.HTTPHandler(nil, nil))
	t.Cleanup(srv.Close)
	for _, method := range []string{"GET", "POST"} {
		code, b := jsonCall(t, srv.URL, method, nil)
		if code != 400 || !strings.Contains(b, "body is empty") || !strings.Contains(b, "domain") {
			t.Errorf("%s /json with no body: %d %s", method, code, b)
		}
	}
}

// The admin API answers a body over its cap with 413, as /json does, not
// with 400 as if the JSON were wrong.
func TestAdminOversizeBodyIs413(t *testing.T) {
	e := newEnv(t, service.Options{Overrides: overrideCache(t)}, diffRules)
	srv := httptest.NewServer(e.svc.AdminHandler(""))
	t.Cleanup(srv.Close)
	big := strings.Repeat("n", 2<<20)
	for _, c := range []struct{ method, path, body string }{
		{"PUT", "/v1/overrides/t/user=u", `{"limit":5,"period":"1s","note":"` + big + `"}`},
		{"POST", "/v1/keys/reset", `{"domain":"t","entries":[{"key":"user","value":"` + big + `"}]}`},
		{"POST", "/v1/keys/inspect", `{"domain":"t","entries":[{"key":"user","value":"` + big + `"}]}`},
	} {
		if code, b := adminCall(t, srv.URL, c.method, c.path, c.body); code != http.StatusRequestEntityTooLarge {
			t.Errorf("%s %s with a 2 MiB body: %d %.200s, want 413", c.method, c.path, code, b)
		}
	}
}

// A key reset or inspect takes one object: one with more after it was
// half applied (the first key reset, the rest ignored, 200). Entries
// beyond ShouldRateLimit's bounds are a bad call (400), not a key no limit
// applies to (404).
func TestAdminKeyBodyIsStrict(t *testing.T) {
	e := newEnv(t, service.Options{}, diffRules)
	srv := httptest.NewServer(e.svc.AdminHandler(""))
	t.Cleanup(srv.Close)
	for range 3 {
		e.ask(t, one("t", 0, d("user", "u")))
	}
	obj := `{"domain":"t","entries":[{"key":"user","value":"u"}]}`
	if code, b := adminCall(t, srv.URL, "POST", "/v1/keys/reset", obj+`{"domain":"t","entries":[{"key":"user","value":"w"}]}`); code != 400 || !strings.Contains(b, "more after") {
		t.Fatalf("reset with a second object after the first: %d %s, want 400", code, b)
	}
	code, b := adminCall(t, srv.URL, "POST", "/v1/keys/inspect", obj+"\n")
	var got struct{ Remaining int64 }
	if code != 200 || json.Unmarshal([]byte(b), &got) != nil || got.Remaining != 2 {
		t.Fatalf("inspect after the refused reset: %d %s; want 2 left, nothing reset", code, b)
	}
	many := make([]string, service.MaxEntries+1)
	for i := range many {
		many[i] = fmt.Sprintf(`{"key":"k%d","value":"v"}`, i)
	}
	for name, body := range map[string]string{
		"an empty key":   `{"domain":"t","entries":[{"key":"","value":"u"}]}`,
		"a 2 KiB key":    `{"domain":"t","entries":[{"key":"` + strings.Repeat("k", 2048) + `","value":"u"}]}`,
		"33 entries":     `{"domain":"t","entries":[` + strings.Join(many, ",") + `]}`,
		"no entries":     `{"domain":"t","entries":[]}`,
		"an empty body":  ``,
		"a JSON null":    `null`,
		"unknown fields": `{"domain":"t","entries":[{"key":"user","value":"u"}],"x":1}`,
	} {
		for _, path := range []string{"/v1/keys/reset", "/v1/keys/inspect"} {
			if code, b := adminCall(t, srv.URL, "POST", path, body); code != 400 {
				t.Errorf("%s with %s: %d %s, want 400", path, name, code, b)
			}
		}
	}
}

// "Bearer" and its token may be separated by more than one space (RFC
// 9110: 1*SP); the token itself must still match exactly.
func TestBearerTokenAfterSeveralSpaces(t *testing.T) {
	h := service.RequireToken("s3cret", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	for auth, want := range map[string]int{
		"Bearer s3cret":     200,
		"Bearer   s3cret":   200,
		"bearer  s3cret":    200,
		"Bearer s3cre":      401,
		"Bearer s3cret x":   401,
		"Bearer":            401,
		"Bearers3cret":      401,
		"Basic s3cret":      401,
		"Bearer  s3cret  x": 401,
	} {
		req := httptest.NewRequest("GET", "/v1/rules", nil)
		req.Header.Set("Authorization", auth)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != want {
			t.Errorf("Authorization %q: %d, want %d", auth, rec.Code, want)
		}
	}
}

// /debug/pprof/cmdline shows the command line without its secrets: the
// admin token, and the password of a Redis URL (which the admin token
// does not otherwise give).
func TestPprofCmdlineHidesSecrets(t *testing.T) {
	old := os.Args
	t.Cleanup(func() { os.Args = old })
	os.Args = []string{"floodgate", "serve", "--admin-token", "tok1", "-admin-token=tok2", "--store",
		"redis://user:pw3@10.0.0.1:6379/0", "--store=redis-sentinel://:pw4@h1:26379,h2:26379/mymaster",
		"--rules", "./rules", "--data=/var/lib/fg"}
	e := newEnv(t, service.Options{}, diffRules)
	srv := httptest.NewServer(e.svc.AdminHandler(""))
	t.Cleanup(srv.Close)
	code, b := adminCall(t, srv.URL, "GET", "/debug/pprof/cmdline", "")
	if code != 200 {
		t.Fatalf("cmdline: %d %s", code, b)
	}
	for _, secret := range []string{"tok1", "tok2", "pw3", "pw4", "user:"} {
		if strings.Contains(b, secret) {
			t.Errorf("cmdline shows %q: %q", secret, b)
		}
	}
	for _, kept := range []string{"serve", "--admin-token", "10.0.0.1:6379/0", "h1:26379,h2:26379/mymaster", "./rules", "--data=/var/lib/fg"} {
		if !strings.Contains(b, kept) {
			t.Errorf("cmdline lost %q: %q", kept, b)
		}
	}
}
