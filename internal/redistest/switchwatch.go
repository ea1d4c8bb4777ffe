package redistest

import (
	"context"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"
)

// A Switch is one +switch-master event of a sentinel, as a test saw it.
type Switch struct {
	At   time.Time // when the event arrived
	From string    // the old master, host:port
	To   string    // the new master, host:port
}

// WatchSwitch subscribes to the sentinel's +switch-master channel and
// returns a channel that receives each switch of s's master, at the moment
// the event arrives (the same event rueidis's sentinel client follows).
// The subscription ends with the test.
func (s *SentinelSet) WatchSwitch(t testing.TB) <-chan Switch {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{s.Sentinel.Addr}, ForceSingleClient: true, DisableCache: true})
	if err != nil {
		t.Fatalf("connect to the sentinel %s: %v", s.Sentinel.Addr, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan Switch, 16)
	subscribed := make(chan struct{})
	var once sync.Once
	done := make(chan struct{})
	t.Cleanup(func() {
		cancel()
		c.Close()
		<-done
	})
	go func() {
		defer close(done)
		dc, release := c.Dedicate()
		defer release()
		wait := dc.SetPubSubHooks(rueidis.PubSubHooks{
			OnSubscription: func(rueidis.PubSubSubscription) { once.Do(func() { close(subscribed) }) },
			OnMessage: func(m rueidis.PubSubMessage) {
				// <master name> <old ip> <old port> <new ip> <new port>
				f := strings.Fields(m.Message)
				if len(f) == 5 && f[0] == s.Name {
					out <- Switch{At: time.Now(), From: net.JoinHostPort(f[1], f[2]), To: net.JoinHostPort(f[3], f[4])}
				}
			},
		})
		dc.Do(ctx, dc.B().Subscribe().Channel("+switch-master").Build())
		select {
		case <-wait:
		case <-ctx.Done():
		}
	}()
	select {
	case <-subscribed:
	case <-done:
		t.Fatalf("SUBSCRIBE +switch-master on %s failed", s.Sentinel.Addr)
	case <-time.After(10 * time.Second):
		t.Fatalf("SUBSCRIBE +switch-master on %s: no confirmation within 10s", s.Sentinel.Addr)
	}
	return out
}

// A NodeSample is one reading of a server's INFO.
type NodeSample struct {
	Sent, At time.Time // when INFO was sent, and when its answer came
	Calls    int64     // how many times the server has run the command sampled
	Master   bool      // the server's role is master
	Copying  bool      // the server is a replica whose link to its master is up
}

// A CallSampler reads, every few milliseconds, how many times each of some
// servers has run a command (INFO commandstats) and its role: which node
// a client's calls go to, over time, and when a replica became a master.
type CallSampler struct {
	stop    chan struct{}
	done    chan struct{}
	mu      sync.Mutex
	samples [][]NodeSample // per server, in time order
}

// SampleCalls starts reading, every interval, how many times each server
// at addrs has run cmd (lower case, as INFO commandstats names it: "fcall"),
// until Stop or the test's end, logged in as user with pass (none: the
// default user).
func SampleCalls(t testing.TB, user, pass, cmd string, interval time.Duration, addrs ...string) *CallSampler {
	t.Helper()
	cs := &CallSampler{stop: make(chan struct{}), done: make(chan struct{}), samples: make([][]NodeSample, len(addrs))}
	clients := make([]rueidis.Client, len(addrs))
	for i, a := range addrs {
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{a}, Username: user, Password: pass, ForceSingleClient: true, DisableCache: true})
		if err != nil {
			for _, c := range clients[:i] {
				c.Close()
			}
			t.Fatalf("connect to %s: %v", a, err)
		}
		clients[i] = c
	}
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Go(func() {
			tick := time.NewTicker(interval)
			defer tick.Stop()
			for {
				sent := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				info, err := c.Do(ctx, c.B().Info().Section("commandstats", "replication").Build()).ToString()
				cancel()
				if err == nil {
					calls, master, copying := parseInfo(info, cmd)
					cs.mu.Lock()
					cs.samples[i] = append(cs.samples[i], NodeSample{Sent: sent, At: time.Now(), Calls: calls, Master: master, Copying: copying})
					cs.mu.Unlock()
				}
				select {
				case <-cs.stop:
					return
				case <-tick.C:
				}
			}
		})
	}
	go func() {
		wg.Wait()
		for _, c := range clients {
			c.Close()
		}
		close(cs.done)
	}()
	t.Cleanup(func() { cs.Stop() })
	return cs
}

// parseInfo reads the calls of cmd, the role and the state of a replica's
// link from INFO's answer.
func parseInfo(info, cmd string) (calls int64, master, copying bool) {
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		if rest, ok := strings.CutPrefix(line, "cmdstat_"+cmd+":calls="); ok {
			n, _, _ := strings.Cut(rest, ",")
			calls, _ = strconv.ParseInt(n, 10, 64)
		}
		switch line {
		case "role:master":
			master = true
		case "master_link_status:up":
			copying = true
		}
	}
	return calls, master, copying && !master
}

// Stop ends the sampling and returns each server's samples, in the order
// of the addresses given to SampleCalls.
func (cs *CallSampler) Stop() [][]NodeSample {
	select {
	case <-cs.stop:
	default:
		close(cs.stop)
	}
	<-cs.done
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.samples
}

// LastChange returns when the calls counted last changed: after the
// sending of the last sample with fewer calls than the final number, and
// by the arrival of the first with that number (zero times without
// samples; after is zero if every sample has the final number). A busy
// machine that delays the sampler widens the interval; after is the
// latest the last call can be proven to have come.
func LastChange(samples []NodeSample) (after, by time.Time) {
	if len(samples) == 0 {
		return time.Time{}, time.Time{}
	}
	last := samples[len(samples)-1].Calls
	for i, s := range samples {
		if s.Calls == last {
			if i > 0 {
				after = samples[i-1].Sent
			}
			return after, s.At
		}
	}
	return time.Time{}, time.Time{}
}

// CallsAt returns the calls counted by the last sample sent at or before t
// (0 when none was).
func CallsAt(samples []NodeSample, t time.Time) int64 {
	var n int64
	for _, s := range samples {
		if s.Sent.After(t) {
			break
		}
		n = s.Calls
	}
	return n
}

// FirstAbove returns when the calls counted first exceeded n: after the
// sending of the sample before the first that shows it, and by the arrival
// of that one (zero times if none does).
func FirstAbove(samples []NodeSample, n int64) (after, by time.Time) {
	for i, s := range samples {
		if s.Calls > n {
			if i > 0 {
				after = samples[i-1].Sent
			}
			return after, s.At
		}
	}
	return time.Time{}, time.Time{}
}

// Detached returns when a replica's samples first show it no longer
// copying its master (promoted, or its link down): after the sending of
// the sample before (the earliest it can have happened) and by the arrival
// of the first one that shows it. ok is false if none does.
func Detached(samples []NodeSample) (after, by time.Time, ok bool) {
	for i, s := range samples {
		if !s.Copying {
			if i > 0 {
				after = samples[i-1].Sent
			}
			return after, s.At, true
		}
	}
	return time.Time{}, time.Time{}, false
}

// Failover asks the sentinel to fail over (SENTINEL FAILOVER), retrying
// while it does not yet know a replica to promote, and returns when it
// agreed.
func (s *SentinelSet) Failover(t testing.TB) time.Time {
	t.Helper()
	var out string
	WaitFor(t, 20*time.Second, "SENTINEL FAILOVER "+s.Name+" accepted", func() bool {
		out, _ = Cmd(s.Sentinel.Addr, "SENTINEL", "FAILOVER", s.Name)
		return out == "OK"
	})
	return time.Now()
}

// AddUser adds an ACL user with every right to the master, the replica
// and the sentinel: a client's own user, which HideMaster leaves alone.
func (s *SentinelSet) AddUser(t testing.TB, user, pass string) {
	t.Helper()
	for _, n := range []*Server{s.Master, s.Replica, s.Sentinel} {
		if out, err := Cmd(n.Addr, "ACL", "SETUSER", user, "on", ">"+pass, "~*", "&*", "+@all"); err != nil || out != "OK" {
			t.Fatalf("ACL SETUSER %s on %s: %s %v", user, n.Addr, out, err)
		}
	}
}

// HideMaster shuts the sentinel (and the replica's link) out of the
// master, which clients logged in as a user of their own (AddUser: user
// and pass) still reach: a partition between the master and the
// sentinels. It turns the master's default user off and drops its
// connections. The sentinel finds the master down a second later and
// promotes the replica, and can never make the old master a replica.
func (s *SentinelSet) HideMaster(t testing.TB, user, pass string) {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{s.Master.Addr}, Username: user, Password: pass,
		ForceSingleClient: true, DisableCache: true})
	if err != nil {
		t.Fatalf("connect to %s as %s: %v", s.Master.Addr, user, err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, cmd := range []rueidis.Completed{
		c.B().AclSetuser().Username("default").Rule("off").Build(),
		c.B().ClientKill().User("default").Build(),
	} {
		if err := c.Do(ctx, cmd).Error(); err != nil {
			t.Fatalf("%v on %s: %v", cmd.Commands(), s.Master.Addr, err)
		}
	}
}

// SwitchSilently makes the replica the master, in the sentinel's view too,
// without a +switch-master event: REPLICAOF NO ONE on the replica, then
// SENTINEL REMOVE and SENTINEL MONITOR of the replica under the same name.
// A client that follows events alone (it missed the switch) stays on the
// old master, which stays a master. It returns when the sentinel reports
// the new master.
func (s *SentinelSet) SwitchSilently(t testing.TB) time.Time {
	t.Helper()
	for _, c := range [][]string{
		{s.Replica.Addr, "REPLICAOF", "NO", "ONE"},
		{s.Sentinel.Addr, "SENTINEL", "REMOVE", s.Name},
		{s.Sentinel.Addr, "SENTINEL", "MONITOR", s.Name, "127.0.0.1", strconv.Itoa(s.Replica.Port), "1"},
	} {
		if out, err := Cmd(c[0], c[1:]...); err != nil || out != "OK" {
			t.Fatalf("%v on %s: %s %v", c[1:], c[0], out, err)
		}
	}
	at := time.Now()
	if out, _ := Cmd(s.Sentinel.Addr, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", s.Name); !strings.Contains(out, strconv.Itoa(s.Replica.Port)) {
		t.Fatalf("the sentinel reports %q as the master, want %s", out, s.Replica.Addr)
	}
	return at
}
