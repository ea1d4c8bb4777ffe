package redisstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/redistest"
	"github.com/floodgate/floodgate/redisstore"
)

// A store on a Redis's Unix socket shares its keys with one on its TCP
// port: the same server, reached another way.
func TestUnixSocketURL(t *testing.T) {
	srv, sock := redistest.StandaloneUnix(t)
	// generous timeouts: they are not the subject, and a starved host ran
	// past the default 50 ms
	overUnix, err := redisstore.New("unix://"+sock, redisstore.Options{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer overUnix.Close()
	overTCP, err := redisstore.New("redis://"+srv.Addr, redisstore.Options{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer overTCP.Close()
	p := floodgate.MustPolicy("unix", floodgate.Rule{Algorithm: floodgate.FixedWindow, Limit: 3, Period: time.Minute})
	ctx := context.Background()
	u, tc := floodgate.NewLimiter(p, overUnix), floodgate.NewLimiter(p, overTCP)
	for i, l := range []*floodgate.Limiter{u, tc, u} {
		d, err := l.Allow(ctx, "k")
		if err != nil || !d.Allowed || d.Remaining != int64(2-i) {
			t.Fatalf("request %d: %+v, %v; want allowed with %d left", i, d, err, 2-i)
		}
	}
	if d, err := tc.Allow(ctx, "k"); err != nil || d.Allowed {
		t.Fatalf("fourth request over TCP: %+v, %v; want refused, the socket's three counted", d, err)
	}
	// the database number is read from the query
	db2, err := redisstore.New("unix://"+sock+"?db=2", redisstore.Options{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db2.Close()
	if d, err := floodgate.NewLimiter(p, db2).Allow(ctx, "k"); err != nil || !d.Allowed || d.Remaining != 2 {
		t.Fatalf("db 2: %+v, %v; want a fresh key", d, err)
	}
	if n, _ := redistest.Cmd(srv.Addr, "-n", "2", "DBSIZE"); n != "1" {
		t.Fatalf("db 2 holds %s keys, want 1", n)
	}
}

func TestUnixSocketBadURLs(t *testing.T) {
	for u, want := range map[string]string{
		"unix://":                   "want unix:///absolute/path",
		"unix://host/tmp/r.sock":    "want unix:///absolute/path",
		"unix://relative.sock":      "want unix:///absolute/path",
		"unix:///tmp/":              "want unix:///absolute/path",
		"unix:///tmp/r.sock?x=1":    `unknown parameter "x"`,
		"unix:///tmp/r.sock?db=one": "invalid database number",
		"unix:///tmp/r.sock?db=-1":  "not a database number",
	} {
		if _, err := redisstore.ParseURL(u); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", u, err, want)
		}
	}
	if co, err := redisstore.ParseURL("unix:///run/redis/redis.sock?db=3"); err != nil || co.SelectDB != 3 || len(co.InitAddress) != 1 || co.InitAddress[0] != "/run/redis/redis.sock" {
		t.Errorf("unix:///run/redis/redis.sock?db=3: %+v, %v", co.InitAddress, err)
	}
}

// A redis:// URL's query is what rueidis reads, nothing else: an option of
// another client (go-redis's timeout) or a misspelling is refused by name.
func TestRedisURLQuery(t *testing.T) {
	for _, u := range []string{"redis://h:1?timeout=1s", "redis://h:1/0?dial_timout=1s", "rediss://h:1?pool_size=10"} {
		if _, err := redisstore.ParseURL(u); err == nil || !strings.Contains(err.Error(), "unknown parameter") {
			t.Errorf("%s: %v, want an unknown parameter", u, err)
		}
	}
	for _, u := range []string{"redis://h:1?db=2", "redis://h:1?dial_timeout=2s&client_name=fg", "rediss://h:1?skip_verify=true", "redis://h:1?protocol=2"} {
		if _, err := redisstore.ParseURL(u); err != nil {
			t.Errorf("%s: %v", u, err)
		}
	}
}
