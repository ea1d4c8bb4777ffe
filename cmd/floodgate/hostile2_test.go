package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/floodgate/floodgate/service"
)

// `floodgate check --hits N` with N beyond 32 bits sends all of it (on
// each descriptor, whose hits_addend is 64 bits): cut to the request's 32
// bits, --hits 4294967296 was sent as 0, counted as one hit and admitted.
func TestCheckHitsBeyond32Bits(t *testing.T) {
	dir := t.TempDir()
	writeRules(t, dir, "api.yaml", apiRules) // user: 50 an hour
	s := startServerNoClient(t, "--rules", dir, "--data", t.TempDir())
	for _, hits := range []string{"4294967296", "4294967297", "18446744073709551615"} {
		code, out, errb := runCheck(t, "--addr", s.grpc, "--domain", "api", "--descriptor", "user=h", "--hits", hits)
		var a checkAnswer
		if err := json.Unmarshal([]byte(out), &a); err != nil {
			t.Fatalf("--hits %s: exit %d, %v\n%s%s", hits, code, err, out, errb)
		}
		if code != 3 || a.OverallCode != "OVER_LIMIT" || a.Statuses[0].LimitRemaining != 50 {
			t.Fatalf("--hits %s: exit %d, %+v; want OVER_LIMIT (exit 3) with all 50 left", hits, code, a)
		}
	}
	code, out, _ := runCheck(t, "--addr", s.grpc, "--domain", "api", "--descriptor", "user=h", "--hits", "0")
	var a checkAnswer
	if json.Unmarshal([]byte(out), &a) != nil || code != 0 || a.Statuses[0].LimitRemaining != 50 {
		t.Fatalf("a check after the refused calls: exit %d, %s; want nothing consumed", code, out)
	}
}

// What a careless or hostile client sends to `floodgate serve` costs it
// little and is answered as documented, end to end: a /json value that is
// not UTF-8 is decided (not 400), a megabyte value_to_metric value does
// not make /metrics megabytes, a gRPC connection takes at most
// MaxConcurrentStreams calls at once, and /debug/pprof/cmdline does not
// show the admin token given on the command line.
func TestServeHostileClients(t *testing.T) {
	dir := t.TempDir()
	writeRules(t, dir, "api.yaml", apiRules+`  - key: route
    value_to_metric: true
    rate_limit: {unit: hour, requests_per_unit: 100}
`)
	s := startServerNoClient(t, "--rules", dir, "--data", t.TempDir(), "--admin-token", "tok-on-the-command-line")
	post := func(body []byte) (int, string) {
		t.Helper()
		resp, err := http.Post("http://"+s.http+"/json", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	if code, b := post([]byte(`{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"` + "\xff\xfe" + `"}]}]}`)); code != 200 || !strings.Contains(b, `"limitRemaining":49`) {
		t.Errorf("/json with a value that is not UTF-8: %d %s, want it decided", code, b)
	}

	for i := range 20 {
		v := strings.Repeat("v", 500<<10) + string(rune('a'+i))
		if code, b := post([]byte(`{"domain":"api","descriptors":[{"entries":[{"key":"route","value":"` + v + `"}]}]}`)); code != 200 {
			t.Fatalf("/json with a 500 KiB value: %d %.200s", code, b)
		}
	}
	resp, err := http.Get("http://" + s.http + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	n, _ := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if n > 1<<20 {
		t.Errorf("/metrics is %d bytes after 20 values of 500 KiB; want their series kept short", n)
	}

	c, err := net.DialTimeout("tcp", s.grpc, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	c.Write([]byte(http2.ClientPreface))
	fr := http2.NewFramer(c, c)
	fr.WriteSettings()
	f, err := fr.ReadFrame()
	if err != nil {
		t.Fatal(err)
	}
	if sf, ok := f.(*http2.SettingsFrame); !ok {
		t.Errorf("gRPC listener's first frame: %v, want SETTINGS", f)
	} else if v, ok := sf.Value(http2.SettingMaxConcurrentStreams); !ok || v != service.MaxConcurrentStreams {
		t.Errorf("gRPC SETTINGS_MAX_CONCURRENT_STREAMS %d (sent: %v), want %d", v, ok, service.MaxConcurrentStreams)
	}

	req, _ := http.NewRequest("GET", "http://"+s.admin+"/debug/pprof/cmdline", nil)
	req.Header.Set("Authorization", "Bearer tok-on-the-command-line")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || strings.Contains(string(b), "tok-on-the-command-line") || !strings.Contains(string(b), "--admin-token") {
		t.Errorf("/debug/pprof/cmdline: %d %q; want the command line without the token", resp.StatusCode, b)
	}
}
