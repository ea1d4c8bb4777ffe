package main

import (
	"bytes"
	"io"
	"os"
	"strings"
	"testing"
)

// --max-memory (and FLOODGATE_MAX_MEMORY) takes bytes or a binary unit, for
// serve and proxy alike; a value that does not parse, or is not more than
// 0, is an error naming the flag (or the variable), before anything starts.
func TestMaxMemoryFlag(t *testing.T) {
	parse := map[string]func(args []string) (*commonConfig, error){
		"serve": func(args []string) (*commonConfig, error) {
			c, err := serveFlags(args, io.Discard)
			if err != nil {
				return nil, err
			}
			return &c.commonConfig, nil
		},
		"proxy": func(args []string) (*commonConfig, error) {
			c, err := proxyFlags(append([]string{"--upstream", "http://127.0.0.1:1"}, args...), io.Discard)
			if err != nil {
				return nil, err
			}
			return &c.commonConfig, nil
		},
	}
	const env = "FLOODGATE_MAX_MEMORY"
	unset := func() { t.Setenv(env, ""); os.Unsetenv(env) } // restored after the test
	good := map[string]int64{
		"":           1 << 30, // the default
		"1073741824": 1 << 30,
		"512MiB":     512 << 20,
		"2GiB":       2 << 30,
		"64KiB":      64 << 10,
		"1TiB":       1 << 40,
		"4096B":      4096,
	}
	bad := []string{"bogus", "0", "-1", "", "-1GiB", "1.5GiB", "2GB", "2gib", "2 GiB", "512M", "GiB", "9223372036854775807KiB"}
	for cmd, parse := range parse {
		get := func(args ...string) (int64, error) {
			c, err := parse(args)
			if err != nil {
				return 0, err
			}
			return int64(c.maxMemory), nil
		}
		for v, want := range good {
			unset()
			args := []string{"--max-memory", v}
			if v == "" {
				args = nil
			}
			if got, err := get(args...); err != nil || got != want {
				t.Errorf("%s --max-memory %q: %d, %v; want %d", cmd, v, got, err, want)
			}
			if v == "" {
				continue
			}
			t.Setenv(env, v)
			if got, err := get(); err != nil || got != want {
				t.Errorf("%s %s=%q: %d, %v; want %d", cmd, env, v, got, err, want)
			}
			if got, err := get("--max-memory", "3MiB"); err != nil || got != 3<<20 {
				t.Errorf("%s --max-memory 3MiB with %s=%q: %d, %v; the flag wins", cmd, env, v, got, err)
			}
		}
		unset()
		for _, v := range bad {
			if _, err := get("--max-memory", v); err == nil || !strings.Contains(err.Error(), "max-memory") {
				t.Errorf("%s --max-memory %q: %v, want an error naming the flag", cmd, v, err)
			}
			t.Setenv(env, v)
			if _, err := get(); err == nil || !strings.Contains(err.Error(), env+"=") {
				t.Errorf("%s %s=%q: %v, want an error naming the variable", cmd, env, v, err)
			}
			unset()
		}
	}

	// as the command line sees it: exit 2, the flag named
	var out, errb bytes.Buffer
	code := run([]string{"serve", "--data", t.TempDir(), "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
		"--admin-addr", "127.0.0.1:0", "--max-memory", "lots"}, &out, &errb)
	if code != 2 || !strings.Contains(errb.String(), "-max-memory") {
		t.Errorf("serve --max-memory lots: exit %d\n%s", code, errb.String())
	}
}

// serve runs on the memory store with --max-memory given.
func TestServeWithMaxMemory(t *testing.T) {
	dir := t.TempDir()
	writeRules(t, dir, "api.yaml", apiRules)
	s := startServer(t, "--rules", dir, "--data", t.TempDir(), "--max-memory", "64MiB")
	if code, body := readyz(t, s.http); code != 200 {
		t.Fatalf("readyz: %d %s", code, body)
	}
}
