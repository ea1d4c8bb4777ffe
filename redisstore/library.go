package redisstore

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/redis/rueidis"
)

// call makes one decision's call: FCALL of the function library, loading
// it first if this store has not yet (or Redis lost it: a restart without
// persistence, a new node); EVALSHA/EVAL on servers without functions.
func (s *Store) call(ctx context.Context, key string, args []string) rueidis.RedisResult {
	return s.callOn(ctx, s.client, key, args)
}

// callOn is call on the connection cc (a coalescer's own, or the client).
func (s *Store) callOn(ctx context.Context, cc rueidis.CoreClient, key string, args []string) rueidis.RedisResult {
	if s.scriptMode.Load() {
		return s.script.Exec(ctx, s.client, []string{key}, args)
	}
	if !s.libLoaded.Load() {
		if err := s.loadLibrary(ctx); err != nil {
			return rueidis.NewErrorResult(err)
		}
		if s.scriptMode.Load() {
			return s.script.Exec(ctx, s.client, []string{key}, args)
		}
	}
	r := cc.Do(ctx, s.fcall(key, args))
	if notLoaded(r.Error()) {
		s.libLoaded.Store(false)
		if err := s.loadLibrary(ctx); err != nil {
			return rueidis.NewErrorResult(err)
		}
		r = s.explainMissing(cc.Do(ctx, s.fcall(key, args)))
	}
	return r
}

// explainMissing returns r, or, when r says the library is missing after
// the store tried to load it and its user may not (NOPERM), an error that
// says so rather than Redis's bare "Function not found".
func (s *Store) explainMissing(r rueidis.RedisResult) rueidis.RedisResult {
	if denied := s.loadDenied.Load(); denied != nil && notLoaded(r.Error()) {
		return rueidis.NewErrorResult(fmt.Errorf("redisstore: Redis lacks the function library %s (%w) and this user may not load it (%w): load it as an admin (FUNCTION LOAD) or grant the store's user +function|load",
			LibraryName, r.Error(), *denied))
	}
	return r
}

func (s *Store) fcall(key string, args []string) rueidis.Completed {
	return s.client.B().Fcall().Function(Function).Numkeys(1).Key(key).Arg(args...).Build()
}

// notLoaded reports whether err says the function library is missing.
func notLoaded(err error) bool {
	e, ok := rueidis.IsRedisErr(err)
	return ok && strings.Contains(e.Error(), "Function not found")
}

// loadLibrary loads the function library on every node (FUNCTION LOAD
// REPLACE: the same code under the same name is a no-op in effect). A
// server without functions (before Redis 7) switches the store to scripts.
func (s *Store) loadLibrary(ctx context.Context) error {
	s.libMu.Lock()
	defer s.libMu.Unlock()
	if s.libLoaded.Load() || s.scriptMode.Load() {
		return nil
	}
	lib := Library()
	var l libLoad
	for addr, n := range s.client.Nodes() {
		if l.add(addr, n.Do(ctx, n.B().FunctionLoad().Replace().FunctionCode(lib).Build()).Error()) {
			s.scriptMode.Store(true)
			s.opts.Logger.Warn("redisstore: Redis has no functions (before 7.0); using EVALSHA")
			return nil
		}
	}
	switch {
	case l.loaded > 0:
		s.loadDenied.Store(nil)
	case l.firstErr != nil:
		return l.firstErr
	case l.denied != nil:
		s.loadDenied.Store(&l.denied)
	case l.readonly != nil:
		// no master among the nodes: every decision would fail with
		// READONLY, or with "Function not found" if the master never
		// loaded the library
		return l.readonly
	}
	s.libLoaded.Store(true)
	return nil
}

// libLoad is what the nodes answered FUNCTION LOAD.
type libLoad struct {
	loaded   int   // nodes that loaded the library
	firstErr error // the first failure but those below
	readonly error // the first replica's
	denied   error // the first NOPERM
}

// add counts node addr's answer err, and says whether it has no functions
// (before Redis 7).
func (l *libLoad) add(addr string, err error) (noFunctions bool) {
	if e, ok := rueidis.IsRedisErr(err); ok {
		switch {
		case strings.Contains(e.Error(), "unknown command"):
			return true
		case strings.Contains(e.Error(), "READONLY"):
			// a replica: it gets the library from its master
			if l.readonly == nil {
				l.readonly = fmt.Errorf("redisstore: %s is a replica (%w): decisions write, so point the store at the master, or use redis-sentinel:// or redis-cluster:// to follow it", addr, err)
			}
			return false
		case strings.HasPrefix(e.Error(), "NOPERM"):
			// the store's user may not load code (a least-privilege
			// ACL): use the library an admin loaded
			if l.denied == nil {
				l.denied = fmt.Errorf("FUNCTION LOAD on %s: %w", addr, err)
			}
			return false
		}
	}
	if err != nil {
		if l.firstErr == nil {
			l.firstErr = fmt.Errorf("redisstore: FUNCTION LOAD on %s: %w", addr, err)
		}
		return false
	}
	l.loaded++
	return false
}

// execMulti sends every decision in one pipeline (FCALL; EVALSHA on
// servers without functions), reloading the library for those that found
// it missing.
func (s *Store) execMulti(ctx context.Context, execs []rueidis.LuaExec) []rueidis.RedisResult {
	if s.scriptMode.Load() {
		return s.script.ExecMulti(ctx, s.client, execs...)
	}
	if !s.libLoaded.Load() {
		if err := s.loadLibrary(ctx); err != nil {
			res := make([]rueidis.RedisResult, len(execs))
			for i := range res {
				res[i] = rueidis.NewErrorResult(err)
			}
			return res
		}
		if s.scriptMode.Load() {
			return s.script.ExecMulti(ctx, s.client, execs...)
		}
	}
	cmds := make(rueidis.Commands, len(execs))
	for i, e := range execs {
		cmds[i] = s.fcall(e.Keys[0], e.Args)
	}
	res := s.client.DoMulti(ctx, cmds...)
	var retry []int
	for i, r := range res {
		if notLoaded(r.Error()) {
			retry = append(retry, i)
		}
	}
	if len(retry) > 0 {
		s.libLoaded.Store(false)
		if err := s.loadLibrary(ctx); err == nil {
			again := make(rueidis.Commands, len(retry))
			for j, i := range retry {
				again[j] = s.fcall(execs[i].Keys[0], execs[i].Args)
			}
			for j, r := range s.client.DoMulti(ctx, again...) {
				res[retry[j]] = s.explainMissing(r)
			}
		}
	}
	return res
}

var scriptSHA = sync.OnceValue(func() string { return sha1hex(Script()) })

func (s *Store) sha() string { return scriptSHA() }
