//go:build !unix

package memstore_test

func cpuNanos() int64 { return 0 }
