package adaptive

// TargetsOf returns how many targets t tracks.
func TargetsOf(t *Throttle) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.targets)
}
