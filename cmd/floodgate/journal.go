package main

import (
	"errors"
	"flag"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/floodgate/floodgate/memstore"
)

// journalConfig is the memory store's snapshot and journal settings, for
// serve and proxy (memstore.Options); a Redis store has neither.
type journalConfig struct {
	snapshotEvery positiveDuration
	journal       string // on, off or a path
	sync          positiveDuration
	records       positiveInt
	through       bool
}

// register adds --snapshot-interval, --journal, --journal-sync and
// --journal-sync-records.
func (j *journalConfig) register(fs *flag.FlagSet) {
	j.snapshotEvery = positiveDuration(envDuration("SNAPSHOT_INTERVAL", time.Minute))
	fs.Var(&j.snapshotEvery, "snapshot-interval", "memory store: how often every key is written to the snapshot in --data (and on a clean exit); the journal keeps the changes in between [FLOODGATE_SNAPSHOT_INTERVAL]")
	fs.StringVar(&j.journal, "journal", envString("JOURNAL", "on"), "memory store: on (a journal beside the snapshot in --data), off, or the journal's path (files PATH.<n>): every change since the last snapshot, replayed at start, so that a crash (kill -9, OOM kill, power loss) loses at most about one --journal-sync of decisions (none answered to a kill -9 with --journal-write-through), not everything since the last snapshot [FLOODGATE_JOURNAL]")
	j.sync = positiveDuration(envDuration("JOURNAL_SYNC", 10*time.Millisecond))
	fs.Var(&j.sync, "journal-sync", "memory store: how often the journal is written and fsynced (a group commit); a crash loses at most the decisions of about this long [FLOODGATE_JOURNAL_SYNC]")
	j.records = positiveInt(envInt("JOURNAL_SYNC_RECORDS", 1000))
	fs.Var(&j.records, "journal-sync-records", "memory store: write and fsync the journal as soon as this many changes wait, before --journal-sync is up [FLOODGATE_JOURNAL_SYNC_RECORDS]")
	fs.BoolVar(&j.through, "journal-write-through", envBool("JOURNAL_WRITE_THROUGH"), "memory store: answer a decision only once its journal record is written to the file (a write(2) per decision, shared by those made meanwhile): a kill -9 or OOM kill then loses no decision that was answered, for about 12 µs of CPU a decision (docs/BENCHMARKS.md) [FLOODGATE_JOURNAL_WRITE_THROUGH]")
}

// options sets o's snapshot interval and journal, the snapshot being
// o.SnapshotPath (NAME.snapshot: the journal is NAME.journal beside it).
func (j *journalConfig) options(o *memstore.Options) {
	o.SnapshotInterval = time.Duration(j.snapshotEvery)
	switch strings.ToLower(j.journal) {
	case "off", "false", "0", "no":
		return
	case "on", "true", "1", "yes", "":
		o.JournalPath = strings.TrimSuffix(o.SnapshotPath, filepath.Ext(o.SnapshotPath)) + ".journal"
	default:
		o.JournalPath = j.journal
	}
	o.JournalSync = time.Duration(j.sync)
	o.JournalSyncRecords = int(j.records)
	o.JournalWriteThrough = j.through
}

// positiveDuration is a flag's duration, more than 0.
type positiveDuration time.Duration

func (d *positiveDuration) String() string { return time.Duration(*d).String() }

func (d *positiveDuration) Set(v string) error {
	x, err := time.ParseDuration(v)
	if err != nil {
		return errors.New("want a duration: 10ms, 1s, 1m")
	}
	if x <= 0 {
		return fmt.Errorf("%v: want more than 0", x)
	}
	*d = positiveDuration(x)
	return nil
}

// positiveInt is a flag's whole number, more than 0.
type positiveInt int

func (n *positiveInt) String() string { return strconv.Itoa(int(*n)) }

func (n *positiveInt) Set(v string) error {
	x, err := strconv.Atoi(v)
	if err != nil || x <= 0 {
		return errors.New("want a whole number more than 0")
	}
	*n = positiveInt(x)
	return nil
}
