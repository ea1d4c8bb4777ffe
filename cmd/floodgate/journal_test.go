package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/floodgate/floodgate/memstore"
)

const quotaRules = `domain: quota
descriptors:
  - key: user
    rate_limit:
      unit: day
      requests_per_unit: 1000
`

// kill9 runs `floodgate serve` with args (and no snapshot for an hour),
// spends a 1000/day quota from 8 callers until `spend` were answered OK,
// kills the process with SIGKILL while they go on, restarts it on the same
// data directory and returns how many were answered OK before the kill, how
// many were sent, how many the restarted service counts, and the rate at
// which they were answered (per second).
func kill9(t *testing.T, spend int64, args ...string) (answered, sent, counted int64, rate float64) {
	t.Helper()
	rules, data := t.TempDir(), t.TempDir()
	writeRules(t, rules, "quota.yaml", quotaRules)
	clearOfWindowEnd(t, 24*time.Hour, 5*time.Minute)
	args = append([]string{"--rules", rules, "--data", data, "--snapshot-interval", "1h"}, args...)
	s := startServer(t, args...)
	var ok, tried atomic.Int64
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(context.Background())
	began := time.Now()
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				tried.Add(1)
				resp, err := s.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "quota",
					Descriptors: []*rlcommon.RateLimitDescriptor{desc("user", "alice")}})
				if err != nil {
					return // killed
				}
				if resp.OverallCode == rlsv3.RateLimitResponse_OK {
					ok.Add(1)
				}
			}
		}()
	}
	waitFor(t, "the first answers", func() bool { return ok.Load() >= spend })
	s.cmd.Process.Kill() // SIGKILL: no drain, no last snapshot
	<-s.done
	answered = ok.Load() // nothing more is answered now
	rate = float64(answered) / time.Since(began).Seconds()
	cancel()
	wg.Wait()
	sent = tried.Load()
	s.conn.Close()
	if _, err := os.Stat(filepath.Join(data, "memstore.snapshot")); err == nil {
		t.Fatal("a snapshot was written before the kill; the test wants the journal alone")
	}

	s2 := startServer(t, args...)
	st := s2.ask(t, "quota", desc("user", "alice")).Statuses[0]
	counted = 1000 - int64(st.LimitRemaining) - 1
	return answered, sent, counted, rate
}

// A kill -9 under load, with the default journal (written through):
// every decision answered before the kill is counted after the restart.
// Without the journal, the whole quota spent since the last snapshot
// came back (here, all of it).
func TestServeKill9LosesNothingAnswered(t *testing.T) {
	answered, sent, counted, _ := kill9(t, 300)
	t.Logf("answered OK before the kill: %d, sent: %d, counted after the restart: %d", answered, sent, counted)
	if counted < answered {
		t.Errorf("%d decisions answered before the kill, %d counted after the restart: %d lost", answered, counted, answered-counted)
	}
	if counted > sent {
		t.Errorf("%d counted after the restart, more than the %d sent", counted, sent)
	}
}

// What kill -9 loses at each journal setting, for docs/BENCHMARKS.md: run
// with FLOODGATE_KILL9_REPORT=1 (it takes a minute or two).
func TestServeKill9LossReport(t *testing.T) {
	if os.Getenv("FLOODGATE_KILL9_REPORT") == "" {
		t.Skip("set FLOODGATE_KILL9_REPORT=1 to measure")
	}
	for _, setting := range [][]string{
		{"--journal", "off"},
		{"--journal-write-through=false", "--journal-sync", "100ms"},
		{"--journal-write-through=false", "--journal-sync", "10ms"},
		{"--journal-write-through=false", "--journal-sync", "1ms"},
		{"--journal-sync", "10ms"}, // the default: written through
	} {
		for run := range 3 {
			answered, sent, counted, rate := kill9(t, 500, setting...)
			lost := max(0, answered-counted)
			t.Logf("%-50s run %d: answered %d (%.0f/s), sent %d, counted after restart %d: lost %d answered (%.0f ms of decisions)",
				strings.Join(setting, " "), run, answered, rate, sent, counted, lost, 1000*float64(lost)/rate)
		}
	}
}

// --snapshot-interval, --journal, --journal-sync, --journal-sync-records
// and --journal-write-through (and their FLOODGATE_* variables) set the
// memory store's options; a value that is not more than 0 is an error
// naming the flag.
func TestJournalFlags(t *testing.T) {
	for _, v := range []string{"FLOODGATE_SNAPSHOT_INTERVAL", "FLOODGATE_JOURNAL", "FLOODGATE_JOURNAL_SYNC",
		"FLOODGATE_JOURNAL_SYNC_RECORDS", "FLOODGATE_JOURNAL_WRITE_THROUGH"} {
		t.Setenv(v, "")
		os.Unsetenv(v)
	}
	opts := func(cmd string, args ...string) (memstore.Options, error) {
		var c *commonConfig
		if cmd == "serve" {
			sc, err := serveFlags(args, io.Discard)
			if err != nil {
				return memstore.Options{}, err
			}
			c = &sc.commonConfig
		} else {
			pc, err := proxyFlags(append([]string{"--upstream", "http://127.0.0.1:1"}, args...), io.Discard)
			if err != nil {
				return memstore.Options{}, err
			}
			c = &pc.commonConfig
		}
		o := memstore.Options{SnapshotPath: "/d/memstore.snapshot"}
		c.journal.options(&o)
		return o, nil
	}
	for _, cmd := range []string{"serve", "proxy"} {
		o, err := opts(cmd)
		if err != nil || o.JournalPath != "/d/memstore.journal" || o.JournalSync != 10*time.Millisecond ||
			o.JournalSyncRecords != 1000 || !o.JournalWriteThrough || o.SnapshotInterval != time.Minute {
			t.Errorf("%s defaults: %+v %v", cmd, o, err)
		}
		o, err = opts(cmd, "--journal", "off", "--snapshot-interval", "5m")
		if err != nil || o.JournalPath != "" || o.SnapshotInterval != 5*time.Minute {
			t.Errorf("%s --journal off: %+v %v", cmd, o, err)
		}
		o, err = opts(cmd, "--journal", "/j/x", "--journal-sync", "1ms", "--journal-sync-records", "7", "--journal-write-through=false")
		if err != nil || o.JournalPath != "/j/x" || o.JournalSync != time.Millisecond || o.JournalSyncRecords != 7 || o.JournalWriteThrough {
			t.Errorf("%s with every flag: %+v %v", cmd, o, err)
		}
		t.Setenv("FLOODGATE_JOURNAL_SYNC", "100ms")
		t.Setenv("FLOODGATE_JOURNAL_WRITE_THROUGH", "false")
		if o, err = opts(cmd); err != nil || o.JournalSync != 100*time.Millisecond || o.JournalWriteThrough {
			t.Errorf("%s from the environment: %+v %v", cmd, o, err)
		}
		os.Unsetenv("FLOODGATE_JOURNAL_SYNC")
		os.Unsetenv("FLOODGATE_JOURNAL_WRITE_THROUGH")
		for _, bad := range [][]string{{"--journal-sync", "0s"}, {"--journal-sync", "-1ms"}, {"--journal-sync-records", "0"},
			{"--snapshot-interval", "0"}, {"--journal-write-through=maybe"}} {
			if _, err := opts(cmd, bad...); err == nil || !strings.Contains(err.Error(), strings.TrimPrefix(strings.Split(bad[0], "=")[0], "--")) {
				t.Errorf("%s %v: %v, want an error naming the flag", cmd, bad, err)
			}
		}
		t.Setenv("FLOODGATE_JOURNAL_SYNC_RECORDS", "none")
		if _, err := opts(cmd); err == nil || !strings.Contains(err.Error(), "FLOODGATE_JOURNAL_SYNC_RECORDS") {
			t.Errorf("%s FLOODGATE_JOURNAL_SYNC_RECORDS=none: %v, want an error naming it", cmd, err)
		}
		os.Unsetenv("FLOODGATE_JOURNAL_SYNC_RECORDS")
	}
}
