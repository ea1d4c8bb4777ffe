//go:build !linux

package testproc

import "os/exec"

// Without a parent-death signal or /proc, only the tests' cleanups stop
// children.

func setDeathSignal(*exec.Cmd) {}

func register(int) string { return "" }

func unregister(string) {}

// Sweep does nothing here: records need Linux's /proc.
func Sweep() {}
