package redisstore_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/redistest"
	"github.com/floodgate/floodgate/redisstore"
)

// logBuffer collects a store's log lines (Options.Logger).
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *logBuffer) logger() *slog.Logger { return slog.New(slog.NewTextHandler(b, nil)) }

// failoverPolicy fails closed, so a decision Redis did not make shows.
var failoverPolicy = floodgate.MustPolicy("fo", floodgate.Rule{Name: "r", Algorithm: floodgate.FixedWindow, Limit: 1 << 30, Period: time.Hour, OnStoreFailure: floodgate.FailClosed})

// decideOnce makes one decision on key, within a second.
func decideOnce(t *testing.T, s *redisstore.Store, key string) floodgate.Decision {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	d, err := s.Do(ctx, time.Now().UnixMicro(), floodgate.Op{Policy: failoverPolicy, Key: key, Cost: 1})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// A store pointed at a replica (a redis:// URL naming the wrong host, or a
// master demoted without Sentinel) says so: FUNCTION LOAD's READONLY was
// skipped as if a master elsewhere had the library, and every decision
// failed with Redis's "Function not found", which sends an operator to
// look for a missing library. Once the server is promoted, decisions are
// Redis's again, without a restart.
func TestReplicaURLSaysReplica(t *testing.T) {
	m := redistest.Standalone(t)
	r := redistest.ReplicaOf(t, m)
	var logs logBuffer
	// generous timeouts in this file: they are not the subject, and a
	// starved host runs past the default 50 ms
	s, err := redisstore.New("redis://"+r.Addr, redisstore.Options{Logger: logs.logger(), BreakerCooldown: 50 * time.Millisecond, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if d := decideOnce(t, s, "k"); d.Allowed || !d.Degraded || d.Reason != floodgate.ReasonStoreUnavailable {
		t.Fatalf("a decision on a replica: %+v, want the failure mode's (closed)", d)
	}
	if out := logs.String(); !strings.Contains(out, "is a replica") || !strings.Contains(out, "READONLY") {
		t.Fatalf("the store's log does not say its Redis is a replica:\n%s", out)
	}
	if out, err := redistest.Cmd(r.Addr, "REPLICAOF", "NO", "ONE"); err != nil || out != "OK" {
		t.Fatalf("REPLICAOF NO ONE: %s %v", out, err)
	}
	redistest.WaitFor(t, 30*time.Second, "decisions on the promoted server", func() bool {
		d := decideOnce(t, s, "k")
		return !d.Degraded && d.Allowed
	})
}

// A store whose ACL user may run the library but not load it (FUNCTION
// denied: least privilege, or a managed Redis; an admin loads the
// library) uses the library that is there: FUNCTION LOAD's NOPERM had
// failed every decision, the library present or not. When the library is
// gone the error says why; once an admin loads it again decisions are
// Redis's again.
func TestLibraryLoadedByAdmin(t *testing.T) {
	srv := redistest.Standalone(t)
	if out, err := redistest.Cmd(srv.Addr, "ACL", "SETUSER", "limiter", "on", ">pw", "~*", "+@all", "-function"); err != nil || out != "OK" {
		t.Fatalf("ACL SETUSER: %s %v", out, err)
	}
	admin := openStore(t, srv, redisstore.Options{Timeout: 10 * time.Second})
	if d := decideOnce(t, admin, "warm"); d.Degraded { // loads the library
		t.Fatalf("admin: %+v", d)
	}
	var logs logBuffer
	s, err := redisstore.New("redis://limiter:pw@"+srv.Addr, redisstore.Options{Logger: logs.logger(), BreakerCooldown: 50 * time.Millisecond, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := range 3 {
		if d := decideOnce(t, s, "k"); d.Degraded || !d.Allowed {
			t.Fatalf("decision %d by a user that may not load the loaded library: %+v\n%s", i, d, logs.String())
		}
	}
	// The library is lost (a restart without persistence): the error says
	// what to do.
	if out, err := redistest.Cmd(srv.Addr, "FUNCTION", "FLUSH"); err != nil || out != "OK" {
		t.Fatalf("FUNCTION FLUSH: %s %v", out, err)
	}
	if d := decideOnce(t, s, "k"); !d.Degraded || d.Allowed {
		t.Fatalf("without the library: %+v, want the failure mode's (closed)", d)
	}
	if out := logs.String(); !strings.Contains(out, "may not load it") || !strings.Contains(out, "NOPERM") {
		t.Fatalf("the store's log does not say why the library is missing:\n%s", out)
	}
	if d := decideOnce(t, admin, "warm"); d.Degraded { // the admin loads it again
		t.Fatalf("admin: %+v", d)
	}
	redistest.WaitFor(t, 30*time.Second, "decisions on Redis once the library is back", func() bool {
		d := decideOnce(t, s, "k")
		return !d.Degraded && d.Allowed
	})
}
