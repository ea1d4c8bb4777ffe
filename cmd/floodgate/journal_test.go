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

// killed is what kill9 saw.
type killed struct {
	answered, sent, counted int64       // answered OK before the kill, sent, counted after the restart
	rate                    float64     // answered OK per second
	at                      time.Time   // the kill
	times                   []time.Time // of the OK answers
}

// lost is how many answered OK are not counted after the restart.
func (k killed) lost() int64 { return max(0, k.answered-k.counted) }

// within is how many OK answers came in the last d before the kill.
func (k killed) within(d time.Duration) int64 {
	n := int64(0)
	for _, at := range k.times {
		if at.After(k.at.Add(-d)) {
			n++
		}
	}
	return n
}

// kill9 runs `floodgate serve` with args (and no snapshot for an hour),
// spends a 1000/day quota from 8 callers, each pausing pace between calls,
// until `spend` were answered OK, kills the process with SIGKILL while they
// go on, and restarts it on the same data directory to ask what it counts.
func kill9(t *testing.T, spend int64, pace time.Duration, args ...string) killed {
	t.Helper()
	rules, data := t.TempDir(), t.TempDir()
	writeRules(t, rules, "quota.yaml", quotaRules)
	clearOfWindowEnd(t, 24*time.Hour, 5*time.Minute)
	args = append([]string{"--rules", rules, "--data", data, "--snapshot-interval", "1h"}, args...)
	s := startServer(t, args...)
	var ok, tried atomic.Int64
	var mu sync.Mutex
	var times []time.Time
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
					at := time.Now()
					mu.Lock()
					times = append(times, at)
					mu.Unlock()
					ok.Add(1)
				}
				time.Sleep(pace)
			}
		}()
	}
	waitFor(t, "the first answers", func() bool { return ok.Load() >= spend })
	var k killed
	k.at = time.Now()
	s.cmd.Process.Kill() // SIGKILL: no drain, no last snapshot
	<-s.done
	k.answered = ok.Load() // nothing more is answered now
	k.rate = float64(k.answered) / time.Since(began).Seconds()
	cancel()
	wg.Wait()
	k.sent, k.times = tried.Load(), times
	s.conn.Close()
	if _, err := os.Stat(filepath.Join(data, "memstore.snapshot")); err == nil {
		t.Fatal("a snapshot was written before the kill; the test wants the journal alone")
	}

	s2 := startServer(t, args...)
	st := s2.ask(t, "quota", desc("user", "alice")).Statuses[0]
	k.counted = 1000 - int64(st.LimitRemaining) - 1
	return k
}

// A kill -9 under load, writing the journal through: every decision
// answered before the kill is counted after the restart. Without the
// journal, the whole quota spent since the last snapshot came back (here,
// all of it).
func TestServeKill9LosesNothingAnswered(t *testing.T) {
	k := kill9(t, 300, 0, "--journal-write-through")
	t.Logf("answered OK before the kill: %d, sent: %d, counted after the restart: %d", k.answered, k.sent, k.counted)
	if k.counted < k.answered {
		t.Errorf("%d decisions answered before the kill, %d counted after the restart: %d lost", k.answered, k.counted, k.lost())
	}
	if k.counted > k.sent {
		t.Errorf("%d counted after the restart, more than the %d sent", k.counted, k.sent)
	}
}

// A kill -9 under load, on the default journal (written and fsynced every
// 10 ms): what is lost is at most what was answered in the last moments
// before the kill. The bound is about 10 ms and a write's duration; the
// test allows 500 ms (the flusher and its write can be starved on a busy
// machine), against the second and more of answers that were lost without
// the journal.
func TestServeKill9LosesAtMostTheLastSync(t *testing.T) {
	k := kill9(t, 800, 10*time.Millisecond)
	last := k.within(500 * time.Millisecond)
	t.Logf("answered OK before the kill: %d (%.0f/s; %d in its last 500 ms), sent: %d, counted after the restart: %d: lost %d",
		k.answered, k.rate, last, k.sent, k.counted, k.lost())
	if k.lost() > last {
		t.Errorf("%d answered decisions lost, more than the %d answered in the last 500 ms before the kill", k.lost(), last)
	}
	if k.counted > k.sent {
		t.Errorf("%d counted after the restart, more than the %d sent", k.counted, k.sent)
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
		{"--journal-sync", "100ms"},
		{"--journal-sync", "10ms"}, // the default
		{"--journal-sync", "1ms"},
		{"--journal-write-through"},
	} {
		for run := range 3 {
			k := kill9(t, 500, 0, setting...)
			t.Logf("%-30s run %d: answered %d (%.0f/s), sent %d, counted after restart %d: lost %d answered (%.0f ms of decisions)",
				strings.Join(setting, " "), run, k.answered, k.rate, k.sent, k.counted, k.lost(), 1000*float64(k.lost())/k.rate)
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
			o.JournalSyncRecords != 1000 || o.JournalWriteThrough || o.SnapshotInterval != time.Minute {
			t.Errorf("%s defaults: %+v %v", cmd, o, err)
		}
		o, err = opts(cmd, "--journal", "off", "--snapshot-interval", "5m")
		if err != nil || o.JournalPath != "" || o.SnapshotInterval != 5*time.Minute {
			t.Errorf("%s --journal off: %+v %v", cmd, o, err)
		}
		o, err = opts(cmd, "--journal", "/j/x", "--journal-sync", "1ms", "--journal-sync-records", "7", "--journal-write-through")
		if err != nil || o.JournalPath != "/j/x" || o.JournalSync != time.Millisecond || o.JournalSyncRecords != 7 || !o.JournalWriteThrough {
			t.Errorf("%s with every flag: %+v %v", cmd, o, err)
		}
		t.Setenv("FLOODGATE_JOURNAL_SYNC", "100ms")
		t.Setenv("FLOODGATE_JOURNAL_WRITE_THROUGH", "true")
		if o, err = opts(cmd); err != nil || o.JournalSync != 100*time.Millisecond || !o.JournalWriteThrough {
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
