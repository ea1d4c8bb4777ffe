package memstore

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
)

// Two different live policies of one name: the older one, first used
// after the newer, is decided under the newer (a strict login limit
// loosened), and the store says so, once.
func TestSameNamePoliciesAreReported(t *testing.T) {
	var logs bytes.Buffer
	s, err := New(Options{SweepInterval: -1, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	strict := floodgate.MustPolicy("api", floodgate.Rule{Name: "r", Algorithm: floodgate.FixedWindow, Limit: 2, Period: time.Minute})
	loose := floodgate.MustPolicy("api", floodgate.Rule{Name: "r", Algorithm: floodgate.FixedWindow, Limit: 1000, Period: time.Minute})
	ctx := context.Background()
	floodgate.NewLimiter(loose, s).Allow(ctx, "k")
	ls := floodgate.NewLimiter(strict, s)
	for range 3 {
		ls.Allow(ctx, "k")
	}
	if n := strings.Count(logs.String(), "two different live policies"); n != 1 {
		t.Fatalf("%d warnings, want 1:\n%s", n, logs.String())
	}
	// versions of one layout (a policy made again from the same rules, as
	// every reload of rules files does) are not reported
	logs.Reset()
	again := floodgate.MustPolicy("api2", floodgate.Rule{Name: "r", Algorithm: floodgate.FixedWindow, Limit: 5, Period: time.Minute})
	same := floodgate.MustPolicy("api2", floodgate.Rule{Name: "r", Algorithm: floodgate.FixedWindow, Limit: 5, Period: time.Minute})
	floodgate.NewLimiter(same, s).Allow(ctx, "k")
	floodgate.NewLimiter(again, s).Allow(ctx, "k")
	if logs.Len() != 0 {
		t.Fatalf("same layouts reported:\n%s", logs.String())
	}
}
