package redisstore_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/redistest"
	"github.com/floodgate/floodgate/redisstore"
)

// The store's hash slot of a key is Redis's own (CLUSTER KEYSLOT), for
// the keys it writes and for hash tags of every shape.
func TestKeySlotIsRedisCluster(t *testing.T) {
	c := redistest.Cluster(t, 3)
	s, err := redisstore.New("redis-cluster://"+strings.Join(c.Addrs(), ","), redisstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	keys := []string{"", "a", "{", "}", "{}", "{}a", "a{}b{c}", "{a}{b}", "x{a}y", "{{a}}", "a}{b", "user:241531", "\xff\x01é"}
	for i := range 200 {
		keys = append(keys, s.Key("p", "k"+strconv.Itoa(i)), s.Key("p", strings.Repeat("%{}", i%7)+strconv.Itoa(i)))
	}
	keys = append(keys, s.Key("p", strings.Repeat("x", redisstore.MaxKeyBytes+1)))
	for _, k := range keys {
		out, err := redistest.Cmd(c.Nodes[0].Addr, "CLUSTER", "KEYSLOT", k)
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT %q: %v", k, err)
		}
		if got := strconv.Itoa(redisstore.KeySlot(k)); got != out {
			t.Errorf("slot of %q: %s, Redis says %s", k, got, out)
		}
	}
}

// A Cluster master that goes down sends its own keys to the failure modes,
// not every key of the cluster: the store had one breaker, which the dead
// master's refused connections kept open, so in the seconds before its
// replica took over 98.6 % of all decisions were the failure mode's
// (refused, under fail closed), two thirds of them for keys whose masters
// were fine. Through Do and DoBatch (the service's path).
func TestClusterMasterDownDegradesItsKeysOnly(t *testing.T) {
	c := redistest.Cluster(t, 3)
	// the live masters serve their slots on once the cluster has marked the
	// dead one failed (its node timeout, 2 s, may pass within the test's
	// second on a starved host)
	for _, n := range c.Nodes {
		if _, err := redistest.Cmd(n.Addr, "CONFIG", "SET", "cluster-require-full-coverage", "no"); err != nil {
			t.Fatal(err)
		}
	}
	// The store's timeout is not the subject (the dead master refuses
	// connections at once): generous, so that a starved CI host does not
	// time out calls to healthy masters, or the first FUNCTION LOAD.
	s, err := redisstore.New("redis-cluster://"+strings.Join(c.Addrs(), ","),
		redisstore.Options{Timeout: 5 * time.Second, BreakerCooldown: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	decide := func(key string) floodgate.Decision { // decideOnce with a generous deadline
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		d, err := s.Do(ctx, time.Now().UnixMicro(), floodgate.Op{Policy: failoverPolicy, Key: key, Cost: 1})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	victim := c.Nodes[1]
	var keys []string
	onVictim := map[string]bool{}
	for i := range 30 {
		k := fmt.Sprintf("key%d", i)
		keys = append(keys, k)
		if d := decide(k); d.Degraded || !d.Allowed {
			t.Fatalf("healthy cluster: %s: %+v", k, d)
		}
		// the victim answers for its own slots, and MOVED for the others
		out, err := redistest.Cmd(victim.Addr, "EXISTS", s.Key(failoverPolicy.Name(), k))
		onVictim[k] = err == nil && out == "1"
	}
	nv := 0
	for _, k := range keys {
		if onVictim[k] {
			nv++
		}
	}
	if nv == 0 || nv == len(keys) {
		t.Fatalf("%d of %d keys on the victim: want some and not all", nv, len(keys))
	}
	victim.Kill()
	killed := time.Now()
	ops := make([]floodgate.Op, len(keys))
	for i, k := range keys {
		ops[i] = floodgate.Op{Policy: failoverPolicy, Key: k, Cost: 1}
	}
	out := make([]floodgate.Decision, len(ops))
	var healthyDegraded, victimRedis, rounds int
	// the victim's breaker opens within its first decisions; the other
	// masters answer as before
	for time.Since(killed) < time.Second {
		rounds++
		// the dead master's keys first, failures in a row: with one
		// breaker for the store they opened it for every key
		for _, k := range keys {
			if onVictim[k] {
				if d := decide(k); !d.Degraded {
					victimRedis++
				}
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := s.DoBatch(ctx, time.Now().UnixMicro(), ops, out); err != nil {
			t.Fatal(err)
		}
		cancel()
		for i, k := range keys {
			d := out[i]
			if !onVictim[k] && d.Degraded {
				healthyDegraded++
			}
			if onVictim[k] && !d.Degraded {
				victimRedis++
			}
		}
		for _, k := range keys {
			if !onVictim[k] {
				if d := decide(k); d.Degraded {
					healthyDegraded++
				}
			}
		}
	}
	if healthyDegraded > 0 {
		t.Errorf("%d decisions of keys on healthy masters went to the failure mode in %d rounds", healthyDegraded, rounds)
	}
	if victimRedis > 0 {
		t.Errorf("%d decisions of keys on the dead master were Redis's", victimRedis)
	}
	if !s.Stats().Breaker {
		t.Error("no breaker open with a master down")
	}
}
