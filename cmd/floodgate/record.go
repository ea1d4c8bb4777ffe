package main

import (
	"flag"
	"fmt"
	"time"

	"github.com/floodgate/floodgate/rules"
	"github.com/floodgate/floodgate/service"
)

// recordConfig is serve's what-if recorder (service.RecordOptions): the
// requests of the last --record-window, which POST /v1/whatif replays.
type recordConfig struct {
	window     time.Duration
	maxEntries keyCount
	maxBytes   byteSize
}

func (r *recordConfig) register(fs *flag.FlagSet) {
	fs.DurationVar(&r.window, "record-window", envDuration("RECORD_WINDOW", service.DefaultRecordWindow), "keep the ShouldRateLimit requests of the last `duration` for POST /v1/whatif (0: record nothing; at most 1h) [FLOODGATE_RECORD_WINDOW]")
	r.maxEntries = keyCount(envInt("RECORD_MAX_ENTRIES", service.DefaultRecordMaxEntries))
	fs.Var(&r.maxEntries, "record-max-entries", "the what-if recorder's cap on requests kept; past it the oldest are dropped and a what-if says its window is cut [FLOODGATE_RECORD_MAX_ENTRIES]")
	r.maxBytes = envSize("RECORD_MAX_BYTES", service.DefaultRecordMaxBytes)
	fs.Var(&r.maxBytes, "record-max-bytes", "the what-if recorder's cap on the estimated bytes of the requests kept, a `size` (64MiB); past it the oldest are dropped [FLOODGATE_RECORD_MAX_BYTES]")
}

func (r *recordConfig) check() error {
	if r.window < 0 || r.window > service.MaxRecordWindow {
		return fmt.Errorf("serve: --record-window %s: want 0 (off) to %s", r.window, service.MaxRecordWindow)
	}
	return nil
}

func (r *recordConfig) options(ro rules.Options) service.RecordOptions {
	return service.RecordOptions{Window: r.window, MaxEntries: int(r.maxEntries), MaxBytes: int64(r.maxBytes), Rules: ro}
}
