package server

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// watermarkHeader starts a lease watermark file.
const watermarkHeader = "floodgate-capacity-watermark v1"

// PersistLeases makes a single server (no election) survive its own
// restart without over-granting: it keeps in file a lease watermark, a
// time no lease it granted ends after, raised durably (written to a
// temporary file, synced, renamed) before any lease would end past it, to
// now + 2 × the longest lease length (so about once per lease length).
// Called at start, before serving: if the file says leases may still be
// outstanding (its watermark is after now), the table is in learning mode
// until then; with no file, or a watermark passed, it grants at once. A
// file that cannot be read or parsed, or a directory that does not exist,
// is an error naming it.
func (s *Server) PersistLeases(file string) error {
	until, err := ReadWatermark(file)
	if err != nil {
		return err
	}
	if fi, err := os.Stat(filepath.Dir(file)); err != nil || !fi.IsDir() {
		return fmt.Errorf("capacity state %s: its directory: not a directory (%v)", file, err)
	}
	if until.After(time.UnixMicro(s.clock.NowMicro())) {
		s.table.StartLearningUntil(until)
		s.log.Info("capacity: leases granted before a restart may be outstanding: learning mode", "until", until, "state", file)
	}
	s.stateFile = file
	s.table.SetWatermark(until, func(u time.Time) error {
		err := WriteWatermark(file, u)
		if err != nil {
			s.log.Error("capacity: the lease watermark cannot be saved; granting 0", "state", file, "err", err)
		}
		return err
	})
	return nil
}

// SaveHorizon lowers the persisted watermark to the end of the last lease
// a client may still hold (lease.Table.Horizon; the zero time when none),
// for a server that has stopped granting (its gRPC server stopped): a
// restart then learns only while leases are out, and not at all when the
// clients released theirs. It does nothing without PersistLeases.
func (s *Server) SaveHorizon() error {
	if s.stateFile == "" {
		return nil
	}
	h := s.table.Horizon()
	if h.IsZero() {
		h = time.UnixMicro(0) // nothing out: a watermark long passed
	}
	return WriteWatermark(s.stateFile, h)
}

// ReadWatermark reads a lease watermark file (PersistLeases); a missing
// file is the zero time.
func ReadWatermark(file string) (time.Time, error) {
	b, err := os.ReadFile(file)
	if errors.Is(err, fs.ErrNotExist) {
		return time.Time{}, nil
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("capacity state: %w", err)
	}
	rest, ok := strings.CutPrefix(string(b), watermarkHeader+" ")
	if !ok {
		return time.Time{}, fmt.Errorf("capacity state %s:1: not a lease watermark (want %q first)", file, watermarkHeader)
	}
	field, _, _ := strings.Cut(rest, " ")
	us, err := strconv.ParseInt(strings.TrimSpace(field), 10, 64)
	if err != nil || us < 0 {
		return time.Time{}, fmt.Errorf("capacity state %s:1: watermark %q: want microseconds since the epoch", file, field)
	}
	return time.UnixMicro(us), nil
}

// WriteWatermark durably replaces file with the watermark until: written
// to a temporary file beside it, synced, renamed over it, and the
// directory synced, so that a crash leaves the old file or the new one.
func WriteWatermark(file string, until time.Time) error {
	dir := filepath.Dir(file)
	f, err := os.CreateTemp(dir, filepath.Base(file)+".tmp*")
	if err != nil {
		return err
	}
	body := fmt.Sprintf("%s %d %s\n", watermarkHeader, until.UnixMicro(), until.UTC().Format(time.RFC3339Nano))
	_, err = f.WriteString(body)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), file)
	}
	if err != nil {
		os.Remove(f.Name())
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
