//go:build !linux

package loadgen

import "time"

type preciseTimer struct{}

func newPreciseTimer() *preciseTimer { return nil }

func (*preciseTimer) arm(time.Duration) <-chan struct{} { return nil }

func (*preciseTimer) close() {}
