//go:build !race

package overrides

const raceEnabled = false
