package redisstore_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/redistest"
	"github.com/floodgate/floodgate/internal/testproc"
	"github.com/floodgate/floodgate/redisstore"
)

// overadmitPolicies are the policies the over-admission test hammers; each
// admits exactly want requests within the test (limits per day, so nothing
// refills meanwhile).
var overadmitPolicies = map[string]struct {
	rules []floodgate.Rule
	want  int64
}{
	"token_bucket": {[]floodgate.Rule{{Name: "tb", Limit: 500, Period: 24 * time.Hour}}, 500},
	"gcra":         {[]floodgate.Rule{{Name: "g", Algorithm: floodgate.GCRA, Limit: 400, Period: 24 * time.Hour}}, 400},
	"sliding_log":  {[]floodgate.Rule{{Name: "log", Algorithm: floodgate.SlidingLog, Limit: 300, Period: 24 * time.Hour}}, 300},
	"mixed": {[]floodgate.Rule{
		{Name: "window", Algorithm: floodgate.SlidingWindow, Limit: 700, Period: 24 * time.Hour},
		{Name: "sub", Algorithm: floodgate.SlidingSubwindow, Limit: 450, Period: 24 * time.Hour, Granularity: time.Hour},
		{Name: "fixed", Algorithm: floodgate.FixedWindow, Limit: 600, Calendar: floodgate.CalendarMonth},
	}, 450},
}

const (
	overadmitProcs      = 4
	overadmitGoroutines = 16
	overadmitTries      = 40 // per goroutine: 2560 attempts in all
)

// Several OS processes, each with its own client and many goroutines, hit
// one key: the total admitted is exactly what the limit allows.
func TestNoOverAdmissionAcrossProcesses(t *testing.T) {
	srv := redistest.Standalone(t)
	for name, pol := range overadmitPolicies {
		t.Run(name, func(t *testing.T) {
			var wg sync.WaitGroup
			counts := make([]int64, overadmitProcs)
			errs := make([]error, overadmitProcs)
			for i := range overadmitProcs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					cmd := exec.Command(os.Args[0], "-test.run=^TestOverAdmitChild$", "-test.count=1")
					cmd.Env = append(os.Environ(), "FLOODGATE_CHILD_URL=redis://"+srv.Addr, "FLOODGATE_CHILD_POLICY="+name)
					out, err := testproc.CombinedOutput(cmd) // dies with this test binary
					if err != nil {
						errs[i] = fmt.Errorf("child %d: %v\n%s", i, err, out)
						return
					}
					for _, line := range strings.Split(string(out), "\n") {
						if n, ok := strings.CutPrefix(line, "admitted "); ok {
							counts[i], errs[i] = strconv.ParseInt(strings.TrimSpace(n), 10, 64)
							return
						}
					}
					errs[i] = fmt.Errorf("child %d printed no count:\n%s", i, out)
				}()
			}
			wg.Wait()
			var total int64
			for i := range overadmitProcs {
				if errs[i] != nil {
					t.Fatal(errs[i])
				}
				total += counts[i]
			}
			if total != pol.want {
				t.Fatalf("%d processes × %d goroutines admitted %d in all (per process %v), want exactly %d",
					overadmitProcs, overadmitGoroutines, total, counts, pol.want)
			}
		})
	}
}

// TestOverAdmitChild is one process of TestNoOverAdmissionAcrossProcesses.
func TestOverAdmitChild(t *testing.T) {
	url := os.Getenv("FLOODGATE_CHILD_URL")
	if url == "" {
		t.Skip("a child process of TestNoOverAdmissionAcrossProcesses")
	}
	pol := overadmitPolicies[os.Getenv("FLOODGATE_CHILD_POLICY")]
	s, err := redisstore.New(url, redisstore.Options{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	l := floodgate.NewLimiter(floodgate.MustPolicy("overadmit-"+os.Getenv("FLOODGATE_CHILD_POLICY"), pol.rules...), s)
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range overadmitGoroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range overadmitTries {
				d, err := l.Allow(context.Background(), "the-one-key")
				if err != nil || d.Degraded {
					t.Errorf("decision %+v, err %v", d, err)
					return
				}
				if d.Allowed {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	fmt.Printf("admitted %d\n", admitted.Load())
}
