package throttle

// Spare returns a signal for an elastic rule (floodgate.Rule.Spare, with
// Mode floodgate.Elastic): it reports spare capacity while nothing waits
// in the admission queue and fewer than fraction × the limit requests
// are in flight, so an elastic limit stretches while this server has
// room and shrinks back as soon as it queues. It reads three atomic
// counters and takes no lock.
func (t *Throttler) Spare(fraction float64) func() bool {
	return func() bool {
		s := &t.stats
		return s.queued.Load() == 0 && float64(s.inflight.Load()) < fraction*float64(s.limit.Load())
	}
}
