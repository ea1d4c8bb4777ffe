package redisstore_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/redistest"
	"github.com/floodgate/floodgate/redisstore"
)

// The switch tests' numbers. Each key stands for one window: callers move
// to a new key every switchKeyWindow, and a key admits switchLimit in all
// (a fixed window of an hour, every decision at one instant, so no window
// boundary of Redis's falls inside the test), so every key's admissions
// can be counted exactly, whichever node decided them.
const (
	switchLimit     = 50
	switchKeyWindow = 250 * time.Millisecond
	switchTimeout   = 100 * time.Millisecond
	// switchFollow is the subject of these tests: how soon after the
	// sentinel's +switch-master (as a subscriber sees it) the old master
	// takes its last decision and the new one its first. The store
	// follows within a few milliseconds (10 ms of polling rueidis's view,
	// plus rueidis's own reconnection); a second leaves room for a
	// starved 2-core machine.
	switchFollow = time.Second
	// replLag is how much earlier than the replica's promotion (or the
	// loss of its link) a decision may have been made on the old master
	// and still be missing from the new one (asynchronous replication; sub-millisecond on loopback, with
	// room for a busy machine).
	replLag = 100 * time.Millisecond
)

var switchPolicy = floodgate.MustPolicy("sw", floodgate.Rule{Name: "r", Algorithm: floodgate.FixedWindow, Limit: switchLimit, Period: time.Hour, OnStoreFailure: floodgate.FailClosed})

// A switchCall is one decision of the load, as its caller saw it.
type switchCall struct {
	key          int // the key's window: the call's start, in switchKeyWindows since the load began
	start, end   time.Time
	allowed, deg bool
	err          error
}

// TestSentinelFailoverFollowsSwitch runs SENTINEL FAILOVER under load and
// checks that every decision moves to the new master at the
// +switch-master. The coalescer's dedicated connections stayed on the old
// master, which Sentinel leaves a master for about 10 s before making it a
// replica: every decision went on being counted there, then lost in its
// resync, and a closed rule admitted its limit twice in the window of the
// demotion.
func TestSentinelFailoverFollowsSwitch(t *testing.T) {
	set := redistest.Sentinel(t)
	set.AddUser(t, "fg", "fg-pw")
	runSwitch(t, set, switchFollow, 100*time.Millisecond, func(events <-chan redistest.Switch) redistest.Switch {
		set.Failover(t)
		return awaitSwitch(t, set, events)
	})
}

// runSwitch makes decisions from concurrent callers through a store on
// set (logged in as the user fg, password fg-pw: AddUser; its breaker
// probing every cooldown), calls trigger,
// which makes the sentinels switch set's master to its replica and returns
// the switch as the sentinels made it known, and checks, from then:
//   - the old master takes no decision after follow, and the new one
//     takes one within it;
//   - no key admits more than its limit plus what the old master admitted
//     that the new master does not know (replication loss), and the
//     decisions the new master misses were all made on the old master
//     after the replica stopped copying it (its promotion, or the loss of
//     its link; less replLag);
//   - no call waits past the store's timeout (plus faultMargin), and none
//     fails.
func runSwitch(t *testing.T, set *redistest.SentinelSet, follow, cooldown time.Duration, trigger func(events <-chan redistest.Switch) redistest.Switch) {
	starved := redistest.WatchStarvation(t)
	s, err := redisstore.New("redis-sentinel://fg:fg-pw@"+set.Sentinel.Addr+"/"+set.Name, redisstore.Options{
		Timeout: switchTimeout, BreakerCooldown: cooldown, ClientTime: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	at := time.Now().UnixMicro() // every decision's time: one window for the whole test
	decide := func(ctx context.Context, kind floodgate.OpKind, key int) (floodgate.Decision, error) {
		return s.Do(ctx, at, floodgate.Op{Kind: kind, Policy: switchPolicy, Key: "w" + strconv.Itoa(key), Cost: 1})
	}
	eventually(t, 10*time.Second, "a decision on Redis", func() bool {
		d, err := decide(context.Background(), floodgate.OpPeek, -1)
		return err == nil && !d.Degraded
	})
	switches := set.WatchSwitch(t)
	samples := redistest.SampleCalls(t, "fg", "fg-pw", "fcall", 5*time.Millisecond, set.Master.Addr, set.Replica.Addr)

	// the load
	start := time.Now()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var stopOnce sync.Once
	stopLoad := func() { stopOnce.Do(func() { close(stop); wg.Wait() }) }
	defer stopLoad()
	const callers = 8
	calls := make([][]switchCall, callers)
	for g := range callers {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				c := switchCall{start: time.Now()}
				c.key = int(c.start.Sub(start) / switchKeyWindow)
				d, err := decide(context.Background(), floodgate.OpAllow, c.key)
				c.end = time.Now()
				c.allowed, c.deg, c.err = d.Allowed, d.Degraded, err
				calls[g] = append(calls[g], c)
				// paced: callers answered by the failure modes (in
				// microseconds) would otherwise spin, and on a busy
				// 2-core machine a goroutine then waits its turn for
				// longer than any call to Redis
				time.Sleep(time.Millisecond)
			}
		})
	}
	time.Sleep(time.Second) // load on the old master first
	sw := trigger(switches)
	if sw.From != set.Master.Addr || sw.To != set.Replica.Addr {
		t.Fatalf("switch %s -> %s, want %s -> %s", sw.From, sw.To, set.Master.Addr, set.Replica.Addr)
	}
	// Three times the bound: a store still on the old master is seen there
	// (Sentinel demotes it only after about 10 s).
	time.Sleep(time.Until(sw.At.Add(3 * follow)))
	stopLoad()
	end := time.Now()
	smp := samples.Stop()
	old, nw := smp[0], smp[1]

	// where the decisions went
	before := redistest.CallsAt(old, start)
	atSwitch := redistest.CallsAt(old, sw.At)
	if atSwitch <= before {
		t.Fatalf("the old master took no call under load before the switch (%d, then %d)", before, atSwitch)
	}
	// Each time is known between two samples: the checks take the earlier
	// end (a sampler delayed by a busy machine proves nothing late), the
	// log shows both.
	lastOldAfter, lastOld := redistest.LastChange(old)
	firstNewAfter, firstNew := redistest.FirstAbove(nw, redistest.CallsAt(nw, sw.At))
	detachedAfter, detachedBy, ok := redistest.Detached(nw)
	if !ok {
		t.Fatal("the replica never stopped copying the old master")
	}
	t.Logf("replica stopped copying the old master %s..%s before the switch; old master's last call %s..%s after it (%d calls on it after it); new master's first %s..%s after it",
		sw.At.Sub(detachedBy), sw.At.Sub(detachedAfter), lastOldAfter.Sub(sw.At), lastOld.Sub(sw.At), old[len(old)-1].Calls-atSwitch,
		firstNewAfter.Sub(sw.At), firstNew.Sub(sw.At))
	if lastOldAfter.Sub(sw.At) > follow {
		t.Errorf("the old master took calls until %s after the switch (%d calls after it; the test ended %s after it): want none after %s",
			lastOldAfter.Sub(sw.At), old[len(old)-1].Calls-atSwitch, end.Sub(sw.At), follow)
	}
	if firstNew.IsZero() {
		t.Errorf("the new master took no call in the %s after the switch, want one within %s", end.Sub(sw.At), follow)
	} else if firstNewAfter.Sub(sw.At) > follow {
		t.Errorf("the new master took its first call %s after the switch, want within %s", firstNewAfter.Sub(sw.At), follow)
	}

	// what each key admitted, against what the new master counted
	type keyCount struct{ admitted, mayLose int }
	keys := map[int]*keyCount{}
	var n, degraded int
	var slowest time.Duration
	for _, cs := range calls {
		for _, c := range cs {
			n++
			if c.err != nil {
				t.Errorf("call at %s: %v; failures must be decided by the failure modes", c.start.Sub(start), c.err)
				continue
			}
			slowest = max(slowest, c.end.Sub(c.start))
			kc := keys[c.key]
			if kc == nil {
				kc = &keyCount{}
				keys[c.key] = kc
			}
			if c.deg {
				degraded++
			}
			if !c.allowed {
				continue
			}
			kc.admitted++
			// decided on the old master after the replica stopped copying it?
			if !c.end.Before(detachedAfter.Add(-replLag)) && !c.start.After(lastOld) {
				kc.mayLose++
			}
		}
	}
	t.Logf("%d calls, %d degraded, slowest %s", n, degraded, slowest)
	// A call's budget is its timeout plus the margin, grown by how late
	// this process's goroutines woke up during the test (a starved host
	// held a call 578 ms with Redis answering in microseconds).
	if budget := switchTimeout + starved.Allow(faultMargin, 3); slowest > budget {
		t.Errorf("slowest call took %s, more than the %s timeout plus %s (goroutines woke up to %s late)", slowest, switchTimeout, budget-switchTimeout, starved.Worst())
	}
	// the new master's own counts, asked directly
	direct, err := redisstore.New("redis://fg:fg-pw@"+sw.To, redisstore.Options{Timeout: 5 * time.Second, ClientTime: true})
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	lost, over := 0, 0
	for k, kc := range keys {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		d, err := direct.Do(ctx, at, floodgate.Op{Kind: floodgate.OpPeek, Policy: switchPolicy, Key: "w" + strconv.Itoa(k), Cost: 1})
		cancel()
		if err != nil || d.Degraded {
			t.Fatalf("peek key %d on the new master: %+v %v", k, d, err)
		}
		counted := int(switchLimit - d.Remaining)
		if kc.admitted > switchLimit {
			over += kc.admitted - switchLimit
		}
		lost += max(0, kc.admitted-counted)
		if kc.admitted > switchLimit+kc.mayLose {
			t.Errorf("key %d admitted %d, more than its limit %d plus the %d admitted on the old master after the replica stopped copying it",
				k, kc.admitted, switchLimit, kc.mayLose)
		}
		if kc.admitted-counted > kc.mayLose {
			t.Errorf("key %d: %d admissions missing from the new master, but only %d were made on the old master after the replica stopped copying it",
				k, kc.admitted-counted, kc.mayLose)
		}
	}
	t.Logf("%d keys; the new master misses %d admissions; %d admitted over the limits", len(keys), lost, over)
}

// A partition between the master and the Sentinels, which Floodgate still
// reaches: the Sentinels promote the replica and can never demote the old
// master, so a store that follows the old node rather than the Sentinels'
// view decides there for ever, apart from every instance that followed.
func TestSentinelPartitionFollowsSwitch(t *testing.T) {
	set := redistest.Sentinel(t)
	set.AddUser(t, "fg", "fg-pw")
	runSwitch(t, set, switchFollow, 100*time.Millisecond, func(events <-chan redistest.Switch) redistest.Switch {
		set.HideMaster(t, "fg", "fg-pw")
		return awaitSwitch(t, set, events)
	})
}

// awaitSwitch returns the +switch-master of set's master, as a subscriber
// saw it.
func awaitSwitch(t *testing.T, set *redistest.SentinelSet, events <-chan redistest.Switch) redistest.Switch {
	t.Helper()
	select {
	case sw := <-events:
		return sw
	case <-time.After(30 * time.Second):
		t.Fatalf("no +switch-master within 30s; the sentinel's log:\n%s", set.Sentinel.Log())
	}
	panic("unreachable")
}

// A switch no client hears of (a +switch-master missed: rueidis's
// subscription was being made again, or the sentinel it listened to was
// cut off): the store follows the sentinels' view when rueidis next asks
// them, within a second (sentinelRefresh), where it had stayed on the old
// master for good.
func TestSentinelSilentSwitchFollowed(t *testing.T) {
	set := redistest.Sentinel(t)
	set.AddUser(t, "fg", "fg-pw")
	runSwitch(t, set, time.Second+switchFollow, 100*time.Millisecond, func(<-chan redistest.Switch) redistest.Switch {
		at := set.SwitchSilently(t)
		return redistest.Switch{At: at, From: set.Master.Addr, To: set.Replica.Addr}
	})
}

// The master dies under load: the breaker opens, and the failure modes
// decide until Sentinel promotes the replica. At the switch, decisions go
// to the new master, not at the breaker's next probe (here 10 s away): the
// old master's failures say nothing of the new one. The bound is a second
// longer than switchFollow: while the Sentinels still name the dead
// master, rueidis's periodic refresh fails (it cannot reach that master),
// drops its subscription and retries with a backoff of up to a second
// (rueidis's refreshMaxRetryDelay), so it may hear of the switch at its
// next retry rather than by the event (measured 2 ms to 0.4 s).
func TestSentinelMasterKilledFollowsSwitch(t *testing.T) {
	set := redistest.Sentinel(t)
	set.AddUser(t, "fg", "fg-pw")
	runSwitch(t, set, time.Second+switchFollow, 10*time.Second, func(events <-chan redistest.Switch) redistest.Switch {
		set.Master.Kill()
		return awaitSwitch(t, set, events)
	})
}
