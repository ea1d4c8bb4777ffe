package overrides

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func openBolt(t testing.TB) *Bolt {
	t.Helper()
	b, err := OpenBolt(filepath.Join(t.TempDir(), "overrides.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func TestBolt(t *testing.T) { testStore(t, openBolt(t)) }

func TestBoltSurvivesRestart(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "overrides.db")
	b, err := OpenBolt(path)
	if err != nil {
		t.Fatal(err)
	}
	want := Override{Domain: "api", Key: "user=241531", Limit: 5, Period: time.Second, Note: "seed", Updated: time.Unix(1700000000, 0).UTC()}
	if err := b.Put(ctx, want); err != nil {
		t.Fatal(err)
	}
	if err := b.PutMany(ctx, []Override{
		{Domain: "api", Key: "gone", Limit: 1, Period: time.Second},
		{Domain: "web", Key: "ip=10.0.0.1", Limit: 9, Period: time.Minute},
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Delete(ctx, "api", "gone"); err != nil {
		t.Fatal(err)
	}
	// A second opener is refused while the file is held.
	if _, err := OpenBolt(path); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("second open: %v", err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}

	b, err = OpenBolt(path)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if got, ok, err := b.Get(ctx, "api", "user=241531"); !ok || err != nil || got != want {
		t.Fatalf("after restart: %+v %v %v", got, ok, err)
	}
	if _, ok, _ := b.Get(ctx, "api", "gone"); ok {
		t.Fatal("deleted override back after restart")
	}
	if got, ok, _ := b.Get(ctx, "web", "ip=10.0.0.1"); !ok || got.Limit != 9 {
		t.Fatalf("batch after restart: %+v", got)
	}
	doms, err := b.Domains(ctx)
	if err != nil || fmt.Sprint(doms) != "[api web]" {
		t.Fatalf("domains: %v %v", doms, err)
	}
	// A domain's bucket goes with its last override.
	b.Delete(ctx, "web", "ip=10.0.0.1")
	if doms, _ := b.Domains(ctx); fmt.Sprint(doms) != "[api]" {
		t.Fatalf("domains after emptying web: %v", doms)
	}
	if n, _ := b.Count(ctx, "api"); n != 1 {
		t.Fatalf("count: %d", n)
	}
}

func TestBoltCanceledContext(t *testing.T) {
	b := openBolt(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := b.Put(ctx, valid()); err == nil {
		t.Fatal("put with a canceled context")
	}
	if _, _, err := b.Get(ctx, "api", "k"); err == nil {
		t.Fatal("get with a canceled context")
	}
}

// TestBoltMillion puts a million overrides (100,000 under the race
// detector) in batches of 10,000, keys in random order, and reports the
// time and the file's size: 11–18 s and about 120 MB on a 2-core VM
// (BenchmarkBoltPutMany1M compares batch sizes and key order). Skipped
// with -short.
func TestBoltMillion(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	n := 1_000_000
	if raceEnabled {
		n = 100_000
	}
	ctx := context.Background()
	b := openBolt(t)
	start := time.Now()
	batch := make([]Override, 0, 10_000)
	for i := range n {
		// Keys arrive in no particular order, as from an export of
		// another system.
		id := (uint64(i) * 0x9e3779b97f4a7c15) >> 40
		batch = append(batch, Override{Domain: "api", Key: fmt.Sprintf("user=%d", id), Limit: int64(i%1000 + 1), Period: time.Second})
		if len(batch) == cap(batch) || i == n-1 {
			if err := b.PutMany(ctx, batch); err != nil {
				t.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	took := time.Since(start)
	fi, err := os.Stat(b.Path())
	if err != nil {
		t.Fatal(err)
	}
	count, _ := b.Count(ctx, "api")
	t.Logf("%d overrides put in batches of 10,000 in %v (%.1f µs each); %d distinct keys; file %.1f MB (%.0f bytes per override)",
		n, took.Round(time.Millisecond), float64(took.Microseconds())/float64(n), count, float64(fi.Size())/1e6, float64(fi.Size())/float64(count))
	id := (uint64(n/2) * 0x9e3779b97f4a7c15) >> 40
	if o, ok, err := b.Get(ctx, "api", fmt.Sprintf("user=%d", id)); !ok || err != nil || o.Limit != int64(n/2%1000+1) {
		t.Fatalf("spot check: %+v %v %v", o, ok, err)
	}
	page, err := b.List(ctx, "api", "user=5", 1000)
	if err != nil || len(page) != 1000 {
		t.Fatalf("list: %d %v", len(page), err)
	}
}

// Bolt knows which domains have overrides, exactly, so the cache answers
// lookups in the others without a lookup.
func TestBoltKnowsItsDomains(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "o.db")
	b, err := OpenBolt(path)
	if err != nil {
		t.Fatal(err)
	}
	if b.MayHave("d") {
		t.Fatal("an empty file has domain d")
	}
	if err := b.Put(ctx, Override{Domain: "d", Key: "k", Limit: 5, Period: time.Second}); err != nil {
		t.Fatal(err)
	}
	if !b.MayHave("d") || b.MayHave("e") {
		t.Fatal("after a put: wrong domains")
	}
	c := NewCache(b, 100, 0)
	if o, ok, err := c.Get(ctx, "d", "k"); err != nil || !ok || o.Limit != 5 {
		t.Fatalf("cached get: %+v %v %v", o, ok, err)
	}
	if _, ok, err := c.Get(ctx, "e", "k"); err != nil || ok {
		t.Fatalf("a domain without overrides: %v %v", ok, err)
	}
	if _, err := c.Delete(ctx, "d", "k"); err != nil {
		t.Fatal(err)
	}
	if b.MayHave("d") {
		t.Fatal("the last override deleted, the domain remains")
	}
	if _, ok, _ := c.Get(ctx, "d", "k"); ok {
		t.Fatal("a deleted override is still found")
	}
	if err := c.PutMany(ctx, []Override{{Domain: "x", Key: "1", Limit: 1, Period: time.Second}}); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := c.Get(ctx, "x", "1"); !ok {
		t.Fatal("an override put through the cache is not found")
	}
	c.Close()
	// Reopened, the set is read from the file.
	b2, err := OpenBolt(path)
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	if !b2.MayHave("x") || b2.MayHave("d") {
		t.Fatal("reopened: wrong domains")
	}
}
