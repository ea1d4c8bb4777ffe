package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/memstore"
	"github.com/floodgate/floodgate/redisstore"
	"github.com/floodgate/floodgate/rules"
	"github.com/floodgate/floodgate/service"
)

// Flags read their defaults from FLOODGATE_* environment variables.

func envString(name, def string) string {
	if v, ok := os.LookupEnv("FLOODGATE_" + name); ok {
		return v
	}
	return def
}

func envBool(name string) bool { b, _ := strconv.ParseBool(envString(name, "")); return b }

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(envString(name, "")); err == nil {
		return n
	}
	return def
}

func envInt64(name string, def int64) int64 {
	if n, err := strconv.ParseInt(envString(name, ""), 10, 64); err == nil {
		return n
	}
	return def
}

func envFloat(name string, def float64) float64 {
	if f, err := strconv.ParseFloat(envString(name, ""), 64); err == nil {
		return f
	}
	return def
}

func envDuration(name string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(envString(name, "")); err == nil {
		return d
	}
	return def
}

// parseFlags parses args, then checks the FLOODGATE_* variables of the
// flags not given: each flag's default was read from its variable (named
// in its usage, "[FLOODGATE_X]"), where a value that does not parse was
// passed over; here it is parsed as the flag would be, and refused the
// same way, so FLOODGATE_DRAIN_TIMEOUT=bogus or FLOODGATE_X_RATELIMIT_HEADERS=yes
// is an error, not silently the default.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		i := strings.LastIndex(f.Usage, "[FLOODGATE_")
		if err != nil || given[f.Name] || i < 0 || !strings.HasSuffix(f.Usage, "]") {
			return
		}
		name := f.Usage[i+1 : len(f.Usage)-1]
		if v, ok := os.LookupEnv(name); ok {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s=%q: %v (as --%s)", name, v, e, f.Name)
			}
		}
	})
	return err
}

// commonConfig is what serve and proxy are both told.
type commonConfig struct {
	rulesDir, dataDir                string
	adminAddr, adminToken            string
	store                            string
	logLevel, logFormat              string
	calendarMonth                    bool
	drain, reloadEvery, storeTimeout time.Duration
	maxMemory                        byteSize      // the memory store's cap (registerMaxMemory)
	maxKeys                          keyCount      // the memory store's cap on keys (registerMaxMemory)
	localKeys                        keyCount      // a Redis store's table for failure_mode local (redisstore.Options.LocalKeys)
	nearCache                        bool          // a Redis store's near cache (redisstore.Options.NoNearCache, inverted)
	writeBackInterval                time.Duration // redisstore.Options.WriteBackInterval
	journal                          journalConfig
	trace                            traceConfig // --trace-file, --trace-sample (tracing.go)
	noDashboard                      bool        // no /dashboard/ on the admin listener (dashboard.go)

	busy busyHostConfig // the adaptive store timeout's ceiling, /readyz's hysteresis (busyhost.go)
	// sigs receives SIGTERM, SIGINT and SIGHUP from the moment the command
	// starts, so a SIGHUP sent as soon as the listeners answer reloads
	// instead of killing the process (its default action).
	sigs chan os.Signal
}

// register adds the shared flags; dataUse and adminDefault differ by command.
func (c *commonConfig) register(fs *flag.FlagSet, dataUse, adminDefault string) {
	fs.StringVar(&c.rulesDir, "rules", envString("RULES", ""), "directory of YAML rule files (default: the example rules file) [FLOODGATE_RULES]")
	fs.StringVar(&c.dataDir, "data", envString("DATA", "floodgate-data"), "data directory: "+dataUse+" [FLOODGATE_DATA]")
	fs.StringVar(&c.adminAddr, "admin-addr", envString("ADMIN_ADDR", adminDefault), "admin API listen address [FLOODGATE_ADMIN_ADDR]")
	fs.StringVar(&c.adminToken, "admin-token", envString("ADMIN_TOKEN", ""), "bearer token for the admin API; required when it listens beyond loopback, and there at least 128 bits (openssl rand -hex 32) [FLOODGATE_ADMIN_TOKEN]")
	fs.StringVar(&c.store, "store", envString("STORE", "memory"), "memory, or a redis://, rediss://, redis-sentinel://, redis-cluster:// or unix:/// URL shared by a fleet [FLOODGATE_STORE]")
	fs.StringVar(&c.logLevel, "log-level", envString("LOG_LEVEL", "info"), "debug, info, warn or error [FLOODGATE_LOG_LEVEL]")
	fs.StringVar(&c.logFormat, "log-format", envString("LOG_FORMAT", "text"), "text or json [FLOODGATE_LOG_FORMAT]")
	fs.BoolVar(&c.calendarMonth, "calendar-month", envBool("CALENDAR_MONTH"), "unit: month is a calendar month in UTC, as envoyproxy/ratelimit's USE_CALENDAR_MONTH_RATE_LIMIT (default: 30 days) [FLOODGATE_CALENDAR_MONTH]")
	fs.DurationVar(&c.drain, "drain-timeout", envDuration("DRAIN_TIMEOUT", 10*time.Second), "how long SIGTERM waits for in-flight requests [FLOODGATE_DRAIN_TIMEOUT]")
	fs.DurationVar(&c.reloadEvery, "reload-interval", envDuration("RELOAD_INTERVAL", 2*time.Second), "how often rule files are checked for changes; 0: only on SIGHUP (which reloads at once) [FLOODGATE_RELOAD_INTERVAL]")
	fs.DurationVar(&c.storeTimeout, "store-timeout", envDuration("STORE_TIMEOUT", 50*time.Millisecond), "per-call timeout of a remote store; with --store-timeout-max above it, the adaptive timeout's floor [FLOODGATE_STORE_TIMEOUT]")
	fs.DurationVar(&c.writeBackInterval, "write-back-interval", envDuration("WRITE_BACK_INTERVAL", 10*time.Millisecond), "Redis store: how often rules with tier: write_back send their unsynced hits to Redis, in one pipelined call [FLOODGATE_WRITE_BACK_INTERVAL]")
	c.localKeys = keyCount(envInt("STORE_LOCAL_KEYS", 1<<16))
	fs.Var(&c.localKeys, "store-local-keys", "Redis store: how many keys' last state on Redis is kept for rules with failure_mode local, to seed the local limit and charge back what it admitted (about 280 bytes a key); a key beyond it is limited locally from zero and never charged back (floodgate_store_local_untracked_total) [FLOODGATE_STORE_LOCAL_KEYS]")
	c.nearCache = true
	if b, err := strconv.ParseBool(envString("STORE_NEAR_CACHE", "")); err == nil {
		c.nearCache = b
	}
	fs.BoolVar(&c.nearCache, "store-near-cache", c.nearCache, "Redis store: refuse a key that Redis refused until its retry time without asking Redis again (never admits more; floodgate_store_near_cache_hits_total) [FLOODGATE_STORE_NEAR_CACHE]")
	c.busy.register(fs)
	c.trace.register(fs)
	fs.BoolVar(&c.noDashboard, "no-dashboard", envBool("NO_DASHBOARD"), "serve no dashboard at /dashboard/ on the admin listener, and record no decision history for it [FLOODGATE_NO_DASHBOARD]")
}

// prepare checks the admin address, makes the data directory and, with no
// --rules, writes the example rules there.
func (c *commonConfig) prepare(log *slog.Logger) error {
	switch {
	case c.reloadEvery < 0:
		return fmt.Errorf("--reload-interval %v: want 0 (reload on SIGHUP only) or more", c.reloadEvery)
	case c.drain < 0:
		return fmt.Errorf("--drain-timeout %v: want 0 or more", c.drain)
	case c.writeBackInterval <= 0:
		return fmt.Errorf("--write-back-interval %v: want more than 0", c.writeBackInterval)
	case c.storeTimeout <= 0:
		return fmt.Errorf("--store-timeout %v: want more than 0", c.storeTimeout)
	}
	if err := c.trace.check(); err != nil {
		return err
	}
	if err := c.busy.check(); err != nil {
		return err
	}
	if c.adminToken != "" && !visibleToken(c.adminToken) {
		// an HTTP header's value loses its leading and trailing blanks, so
		// such a token could never be sent; a blank one guards nothing
		return fmt.Errorf("--admin-token: want printable ASCII with no leading or trailing blanks (and not only blanks), got %d bytes that are not", len(c.adminToken))
	}
	if !isLoopback(c.adminAddr) && c.adminToken == "" {
		return fmt.Errorf("--admin-addr %s is beyond loopback: set --admin-token (or FLOODGATE_ADMIN_TOKEN) to at least %d random bits; %s", c.adminAddr, minAdminTokenBits, makeToken)
	}
	if err := checkAdminToken(c.adminAddr, c.adminToken, log); err != nil {
		return err
	}
	if err := os.MkdirAll(c.dataDir, 0o700); err != nil {
		return fmt.Errorf("--data %s: %w", c.dataDir, err)
	}
	if c.rulesDir == "" {
		dir := filepath.Join(c.dataDir, "example-rules")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "example.yaml"), rules.ExampleFile, 0o644); err != nil {
			return err
		}
		c.rulesDir = dir
		log.Info("no --rules given: using the example rules", "dir", dir)
	}
	return nil
}

// openedStore is the store a command runs on.
type openedStore struct {
	store floodgate.Store
	redis *redisstore.Store // nil in memory
	ready service.Readiness
	close func() error
}

// openStore opens --store: memory (snapshotted to snapshot in the data
// directory) or Redis, whose counters it registers in m.
func (c *commonConfig) openStore(snapshot string, log *slog.Logger, m *service.Metrics) (*openedStore, error) {
	if c.store == "memory" || c.store == "" {
		opts := memstore.Options{SnapshotPath: filepath.Join(c.dataDir, snapshot), MaxKeys: int(c.maxKeys), MaxMemory: int64(c.maxMemory), Logger: log}
		c.journal.options(&opts)
		ms, err := memstore.New(opts)
		if err != nil {
			return nil, err
		}
		if err := m.Register(newMemCollector(ms, int(c.maxKeys), int64(c.maxMemory))); err != nil {
			ms.Close()
			return nil, err
		}
		return &openedStore{store: ms, ready: func() (bool, string) { return true, "ready: in-memory store" }, close: ms.Close}, nil
	}
	rs, err := redisstore.New(c.store, redisstore.Options{Timeout: c.storeTimeout, MaxTimeout: c.busy.storeTimeoutMax, LocalKeys: int(c.localKeys), NoNearCache: !c.nearCache, WriteBackInterval: c.writeBackInterval, Logger: log})
	if err != nil {
		return nil, err
	}
	if err := errors.Join(m.Register(newStoreCollector(rs)), m.Register(newBusyCollector(rs))); err != nil {
		rs.Close()
		return nil, err
	}
	ready, stop := c.busy.redisReadiness(rs)
	return &openedStore{store: rs, redis: rs, ready: ready, close: func() error { stop(); return rs.Close() }}, nil
}

// registerMaxMemory adds --max-memory and --max-keys, the memory store's
// caps on the bytes of its key tables and on its keys
// (memstore.Options.MaxMemory and MaxKeys), for serve and proxy.
func (c *commonConfig) registerMaxMemory(fs *flag.FlagSet) {
	c.maxMemory = envSize("MAX_MEMORY", 1<<30)
	fs.Var(&c.maxMemory, "max-memory", "memory store: cap on the bytes of its key tables, a `size`: 1073741824, 512MiB, 2GiB; at the cap a new key takes the room of a key whose count has decayed, or, where every key still counts something, is refused and decided by its rules' failure modes; a key that constrains is never dropped (a sliding_log rule takes 8 bytes a key per request of its limit) [FLOODGATE_MAX_MEMORY]")
	c.maxKeys = keyCount(envInt("MAX_KEYS", 1<<22))
	fs.Var(&c.maxKeys, "max-keys", "memory store: cap on its keys, over all limits (a token bucket key takes about 50 bytes); at the cap a new key is held or refused as at --max-memory [FLOODGATE_MAX_KEYS]")
}

// keyCount is a flag's count of keys, more than 0.
type keyCount int

func (k *keyCount) String() string { return strconv.Itoa(int(*k)) }

func (k *keyCount) Set(v string) error {
	n, err := strconv.Atoi(v)
	switch {
	case err != nil:
		return errors.New("want a whole number of keys")
	case n <= 0:
		return errors.New("want more than 0")
	}
	*k = keyCount(n)
	return nil
}

// byteSize is a flag's count of bytes: a whole number of bytes, or of B,
// KiB, MiB, GiB or TiB (GOMEMLIMIT's units), more than 0.
type byteSize int64

func (b *byteSize) String() string {
	n := int64(*b)
	for _, u := range []string{"TiB", "GiB", "MiB", "KiB"} {
		if unit := sizeUnits[u]; n != 0 && n%unit == 0 {
			return strconv.FormatInt(n/unit, 10) + u
		}
	}
	return strconv.FormatInt(n, 10)
}

func (b *byteSize) Set(v string) error {
	n, err := parseSize(v)
	if err != nil {
		return err
	}
	*b = byteSize(n)
	return nil
}

var sizeUnits = map[string]int64{"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}

func parseSize(v string) (int64, error) {
	num := strings.TrimRight(v, "BKMGTi")
	unit, ok := sizeUnits[v[len(num):]]
	n, err := strconv.ParseInt(num, 10, 64)
	switch {
	case !ok || err != nil:
		return 0, errors.New("want bytes, or a whole number of KiB, MiB, GiB or TiB (512MiB, 2GiB)")
	case n <= 0:
		return 0, errors.New("want more than 0")
	case n > math.MaxInt64/unit:
		return 0, errors.New("too large")
	}
	return n * unit, nil
}

// envSize is envDuration for a byteSize.
func envSize(name string, def byteSize) byteSize {
	if n, err := parseSize(envString(name, "")); err == nil {
		return byteSize(n)
	}
	return def
}

// memCollector exports the memory store's counters (memstore.Stats and
// JournalStats) and caps, read at each scrape.
type memCollector struct {
	ms                                           *memstore.Store
	maxKeys, maxBytes                            int64
	keys, bytes, capKeys, capBytes               *prometheus.Desc
	evictions, constraining, expired, refusedNew *prometheus.Desc
	jRecords, jWrites, jSyncs, jErrors, jLost    *prometheus.Desc
}

func newMemCollector(ms *memstore.Store, maxKeys int, maxBytes int64) *memCollector {
	d := func(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, nil, nil) }
	return &memCollector{ms: ms, maxKeys: int64(maxKeys), maxBytes: maxBytes,
		keys:         d("floodgate_memstore_keys", "Keys the memory store holds."),
		bytes:        d("floodgate_memstore_bytes", "Bytes of the memory store's key tables."),
		capKeys:      d("floodgate_memstore_max_keys", "The memory store's cap on keys (--max-keys)."),
		capBytes:     d("floodgate_memstore_max_bytes", "The memory store's cap on the bytes of its key tables (--max-memory)."),
		evictions:    d("floodgate_memstore_evictions_total", "Keys dropped at a cap to make room for a new key: keys whose count had decayed, which forgives nothing."),
		constraining: d("floodgate_memstore_constraining_evictions_total", "Keys dropped at a cap while they still constrained (forgiving what they had used). The store makes none: it refuses the new key instead."),
		expired:      d("floodgate_memstore_expired_total", "Keys dropped by sweeps once their count had decayed."),
		refusedNew:   d("floodgate_memstore_refused_total", "Decisions on new keys the memory store had no room for (at a cap, every key still constraining), made by the rules' failure modes."),
		jRecords:     d("floodgate_memstore_journal_records_total", "State changes appended to the memory store's journal (--journal)."),
		jWrites:      d("floodgate_memstore_journal_writes_total", "Writes of journal records to the file (group commits)."),
		jSyncs:       d("floodgate_memstore_journal_syncs_total", "Fsyncs of the journal."),
		jErrors:      d("floodgate_memstore_journal_errors_total", "Journal writes or fsyncs that failed (each is logged); a crash may then lose more than --journal-sync."),
		jLost:        d("floodgate_memstore_journal_lost_records_total", "Journal records lost to those errors."),
	}
}

// Describe implements prometheus.Collector.
func (c *memCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.keys, c.bytes, c.capKeys, c.capBytes, c.evictions, c.constraining, c.expired, c.refusedNew,
		c.jRecords, c.jWrites, c.jSyncs, c.jErrors, c.jLost} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *memCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.ms.Stats()
	ch <- prometheus.MustNewConstMetric(c.keys, prometheus.GaugeValue, float64(st.Keys))
	ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.GaugeValue, float64(st.Bytes))
	ch <- prometheus.MustNewConstMetric(c.capKeys, prometheus.GaugeValue, float64(c.maxKeys))
	ch <- prometheus.MustNewConstMetric(c.capBytes, prometheus.GaugeValue, float64(c.maxBytes))
	ch <- prometheus.MustNewConstMetric(c.evictions, prometheus.CounterValue, float64(st.Evictions))
	ch <- prometheus.MustNewConstMetric(c.constraining, prometheus.CounterValue, float64(st.Evicted))
	ch <- prometheus.MustNewConstMetric(c.expired, prometheus.CounterValue, float64(st.Expired))
	ch <- prometheus.MustNewConstMetric(c.refusedNew, prometheus.CounterValue, float64(st.Refused))
	js := c.ms.JournalStats()
	ch <- prometheus.MustNewConstMetric(c.jRecords, prometheus.CounterValue, float64(js.Records))
	ch <- prometheus.MustNewConstMetric(c.jWrites, prometheus.CounterValue, float64(js.Writes))
	ch <- prometheus.MustNewConstMetric(c.jSyncs, prometheus.CounterValue, float64(js.Syncs))
	ch <- prometheus.MustNewConstMetric(c.jErrors, prometheus.CounterValue, float64(js.Errors))
	ch <- prometheus.MustNewConstMetric(c.jLost, prometheus.CounterValue, float64(js.Lost))
}

// storeCollector exports a Redis store's counters (redisstore.Stats).
type storeCollector struct {
	rs                                       *redisstore.Store
	calls, errs, timeouts, degraded, breaker *prometheus.Desc
	localCharged, localUntracked             *prometheus.Desc
	wbLocal, wbExact, wbSyncs, wbNodes       *prometheus.Desc
	wbKeys                                   *prometheus.Desc
	over, under, unmeasured                  *prometheus.Desc
	share                                    [6]*prometheus.Desc // redisstore.ShareStats, in its order
	nearHits                                 *prometheus.Desc
}

func newStoreCollector(rs *redisstore.Store) *storeCollector {
	d := func(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, nil, nil) }
	return &storeCollector{rs: rs,
		calls:    d("floodgate_store_calls_total", "Decisions asked of the Redis store."),
		errs:     d("floodgate_store_errors_total", "Redis calls that failed, timeouts included."),
		timeouts: d("floodgate_store_timeouts_total", "Redis calls that ran out of time."),
		degraded: d("floodgate_store_degraded_decisions_total", "Decisions made by the rules' failure modes because Redis did not answer."),
		breaker:  d("floodgate_store_breaker_open", "1 while the breaker is open: calls go straight to the failure modes."),
		localCharged: d("floodgate_store_local_charged_total",
			"Requests admitted by rules failing to local while Redis was away, and charged back to Redis when it answered again."),
		localUntracked: d("floodgate_store_local_untracked_total",
			"Decisions of rules failing to local on keys beyond --store-local-keys: limited from zero, never charged back."),
		wbLocal: d("floodgate_store_writeback_local_total", "Decisions of tier: write_back keys made in memory."),
		wbExact: d("floodgate_store_writeback_exact_total", "Decisions of hot tier: write_back keys made exactly in Redis (near the limit, past the hit threshold, budget too small)."),
		wbSyncs: d("floodgate_store_writeback_syncs_total", "Pipelined calls that sent tier: write_back keys' unsynced hits to Redis."),
		wbNodes: d("floodgate_store_writeback_nodes", "Live nodes deciding tier: write_back keys, as the heartbeats last said."),
		wbKeys:  d("floodgate_store_writeback_keys", "Keys in the tier: write_back table now (hot, or being measured): at most its bound, whatever the flood of keys."),
		over: prometheus.NewDesc("floodgate_tier_overshoot_total",
			"Requests a tier: write_back rule's windows admitted beyond its limit, as this process's syncs measured them (sum over processes).", []string{"rule"}, nil),
		under: prometheus.NewDesc("floodgate_tier_undershoot_total",
			"Requests a tier: write_back rule refused in memory that Redis's count had room for, as this process's syncs measured them.", []string{"rule"}, nil),
		unmeasured: prometheus.NewDesc("floodgate_tier_unmeasured_total",
			"Requests a tier: write_back rule admitted whose hits reached Redis after their window had gone, or in a sync whose reply was lost: the overshoot may be larger by as much.", []string{"rule"}, nil),
		share: [6]*prometheus.Desc{
			d("floodgate_store_share_calls_total", "Local share: calls taking or giving back a slice of a hot key's quota."),
			d("floodgate_store_share_local_total", "Local share: decisions made from a slice, without Redis."),
			d("floodgate_store_share_keys", "Local share: keys holding a slice now."),
			d("floodgate_store_share_nodes", "Local share: live nodes, as last read from their heartbeats."),
			d("floodgate_store_share_returned_total", "Local share: requests of slices given back to Redis unspent."),
			d("floodgate_store_share_lost_total", "Local share: requests of slices that expired unspent or could not be given back."),
		},
		nearHits: d("floodgate_store_near_cache_hits_total",
			"Requests refused by the near cache, without asking Redis, until the time Redis said (--store-near-cache); not in floodgate_store_calls_total."),
	}
}

// Describe implements prometheus.Collector.
func (c *storeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.calls, c.errs, c.timeouts, c.degraded, c.breaker, c.localCharged, c.localUntracked, c.nearHits,
		c.wbLocal, c.wbExact, c.wbSyncs, c.wbNodes, c.wbKeys, c.over, c.under, c.unmeasured} {
		ch <- d
	}
	for _, d := range c.share {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *storeCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.rs.Stats()
	open := 0.0
	if st.Breaker {
		open = 1
	}
	ch <- prometheus.MustNewConstMetric(c.calls, prometheus.CounterValue, float64(st.Calls))
	ch <- prometheus.MustNewConstMetric(c.errs, prometheus.CounterValue, float64(st.Errors))
	ch <- prometheus.MustNewConstMetric(c.timeouts, prometheus.CounterValue, float64(st.Timeouts))
	ch <- prometheus.MustNewConstMetric(c.degraded, prometheus.CounterValue, float64(st.Degraded))
	ch <- prometheus.MustNewConstMetric(c.breaker, prometheus.GaugeValue, open)
	ch <- prometheus.MustNewConstMetric(c.localCharged, prometheus.CounterValue, float64(st.LocalCharged))
	ch <- prometheus.MustNewConstMetric(c.localUntracked, prometheus.CounterValue, float64(st.LocalUntracked))
	ch <- prometheus.MustNewConstMetric(c.wbLocal, prometheus.CounterValue, float64(st.WriteBackLocal))
	ch <- prometheus.MustNewConstMetric(c.wbExact, prometheus.CounterValue, float64(st.WriteBackExact))
	ch <- prometheus.MustNewConstMetric(c.wbSyncs, prometheus.CounterValue, float64(st.WriteBackSyncs))
	ch <- prometheus.MustNewConstMetric(c.wbNodes, prometheus.GaugeValue, float64(st.WriteBackNodes))
	ch <- prometheus.MustNewConstMetric(c.wbKeys, prometheus.GaugeValue, float64(st.WriteBackKeys))
	for _, e := range c.rs.TierErrors() {
		ch <- prometheus.MustNewConstMetric(c.over, prometheus.CounterValue, float64(e.Overshoot), e.Rule)
		ch <- prometheus.MustNewConstMetric(c.under, prometheus.CounterValue, float64(e.Undershoot), e.Rule)
		ch <- prometheus.MustNewConstMetric(c.unmeasured, prometheus.CounterValue, float64(e.Unmeasured), e.Rule)
	}
	sh := st.Share
	for i, v := range []float64{float64(sh.Takes), float64(sh.Local), float64(sh.Keys), float64(sh.Nodes), float64(sh.Returned), float64(sh.Lost)} {
		kind := prometheus.CounterValue
		if i == 2 || i == 3 {
			kind = prometheus.GaugeValue
		}
		ch <- prometheus.MustNewConstMetric(c.share[i], kind, v)
	}
	ch <- prometheus.MustNewConstMetric(c.nearHits, prometheus.CounterValue, float64(st.NearHits))
}

// command is serve's and proxy's frame: a flag error (flagErr) exits 2,
// or 0 for -h; then the logger is made and run runs, a failure exiting 1.
func command(name string, stderr io.Writer, c *commonConfig, flagErr error, run func(*slog.Logger) error) int {
	if flagErr != nil {
		if errors.Is(flagErr, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, flagErr)
		return 2
	}
	log, err := newLogger(c, stderr)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	c.sigs = make(chan os.Signal, 2)
	signal.Notify(c.sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(c.sigs)
	if err := run(log); err != nil {
		log.Error(name + ": " + err.Error())
		return 1
	}
	return 0
}

// serveUntilStopped reloads the rules when their files change (every
// --reload-interval) and on SIGHUP, and returns on SIGTERM or SIGINT, when
// ctx ends, or when a listener fails (errc).
func (c *commonConfig) serveUntilStopped(ctx context.Context, log *slog.Logger, loader *ruleLoader, errc <-chan error, serving string) {
	sigs := c.sigs
	if sigs == nil {
		sigs = make(chan os.Signal, 2)
		signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
		defer signal.Stop(sigs)
	}
	var poll <-chan time.Time // nil, never ready, with no polling
	if c.reloadEvery > 0 {
		tick := time.NewTicker(c.reloadEvery)
		defer tick.Stop()
		poll = tick.C
	}
	log.Info(serving, "store", redactStore(c.store), "rules", c.rulesDir)
	for {
		select {
		case <-ctx.Done():
			return
		case err := <-errc:
			log.Error("listener failed", "err", err)
			return
		case s := <-sigs:
			if s == syscall.SIGHUP {
				loader.reload(true)
				continue
			}
			log.Info("draining", "signal", s.String(), "timeout", c.drain)
			return
		case <-poll:
			loader.reload(false)
		}
	}
}

// visibleToken reports whether tok can be sent as a bearer token as it is:
// printable ASCII, not starting or ending with a space.
func visibleToken(tok string) bool {
	for i := 0; i < len(tok); i++ {
		if tok[i] < ' ' || tok[i] > '~' {
			return false
		}
	}
	return tok[0] != ' ' && tok[len(tok)-1] != ' '
}
