package rules

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// LoadDir loads the rules files of dir (see Files), one domain per file,
// in name order. A file with any error is refused whole and its errors
// reported; the other files load. A file whose domain an earlier file (by
// name) already defines is refused too. The Config is never nil.
func LoadDir(dir string) (*Config, []error) {
	return LoadDirWith(dir, Options{})
}

// LoadDirWith is LoadDir with options.
func LoadDirWith(dir string, opts Options) (*Config, []error) {
	var errs []error
	paths, err := Files(dir)
	if err != nil {
		c, _ := NewConfig()
		return c, []error{fmt.Errorf("rules: %w", err)}
	}
	var domains []*Domain
	byName := map[string]*Domain{}
	for _, path := range paths {
		data, err := ReadFile(path)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		d, err := ParseWith(path, data, opts)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if prev := byName[d.Name]; prev != nil {
			errs = append(errs, DuplicateDomain(path, d.Name, prev.File))
			continue
		}
		byName[d.Name] = d
		domains = append(domains, d)
	}
	c, err := NewConfig(domains...)
	if err != nil { // cannot happen: names are distinct
		c, _ = NewConfig()
		errs = append(errs, err)
	}
	return c, errs
}

// DuplicateDomain is the error of a file refused because the file other
// already defines its domain.
func DuplicateDomain(file, domain, other string) error {
	return &Error{File: file, Field: "domain", Msg: fmt.Sprintf("domain %q is already defined in %s; a domain lives in one file", domain, other)}
}

// IsRulesFile reports whether a directory entry named name is read as a
// rules file: *.yaml or *.yml, and not a hidden name (starting with '.',
// such as an editor's backup or the "..data" links of a Kubernetes
// ConfigMap volume).
func IsRulesFile(name string) bool {
	return !strings.HasPrefix(name, ".") && (strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".yml"))
}

// Files returns the paths of dir's rules files (IsRulesFile), sorted by
// name: not its subdirectories (nor links to directories), and not the
// files of its subdirectories. Links are followed; a link that leads
// nowhere is listed, so that reading it reports the problem.
func Files(dir string) ([]string, error) {
	files, _, err := List(dir)
	return files, err
}

// List returns the paths of dir's rules files, as Files does, and those of
// the entries it skips that look meant to be read: envoyproxy/ratelimit
// reads every file under its directory, recursively and whatever its
// name, so a directory written for it may hold rules in team/sub.yaml,
// rules.conf or noext, which are not loaded here. Skipped are the regular
// files (links followed) that are no rules files, and the subdirectories
// (and links to directories), these with a trailing separator ("team/");
// both sorted by name. Hidden names (starting with '.', such as a
// ConfigMap's "..data" and "..2026_..." entries) and editors' backups and
// swap files (ending in "~", ".swp", ".swo" or ".swx") are not listed:
// they are not meant to be read. Nor are other kinds of entry (FIFOs,
// sockets, links leading nowhere) whose names are no rules files.
func List(dir string) (files, skipped []string, err error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, err
	}
	for _, e := range ents {
		name := e.Name()
		rulesFile := IsRulesFile(name)
		if !rulesFile && (strings.HasPrefix(name, ".") || isEditorFile(name)) {
			continue
		}
		p := filepath.Join(dir, name)
		info, err := os.Stat(p)
		switch {
		case err == nil && info.IsDir():
			skipped = append(skipped, p+string(filepath.Separator))
		case rulesFile:
			files = append(files, p)
		case err == nil && info.Mode().IsRegular():
			skipped = append(skipped, p)
		}
	}
	sort.Strings(files)
	sort.Strings(skipped)
	return files, skipped, nil
}

// isEditorFile reports whether name is an editor's backup or swap file.
func isEditorFile(name string) bool {
	for _, suffix := range []string{"~", ".swp", ".swo", ".swx"} {
		if strings.HasSuffix(name, suffix) {
			return true
		}
	}
	return false
}

// ReadFile reads one rules file: a regular file (links followed) of at
// most MaxFileSize bytes. Anything else — a FIFO, a device such as
// /dev/zero, a directory, a larger file — is refused before it is read,
// so a stray entry in a rules directory can neither block a reload nor
// fill the memory.
func ReadFile(path string) ([]byte, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, &Error{File: path, Msg: err.Error()}
	}
	if err := checkFileInfo(info); err != nil {
		return nil, &Error{File: path, Msg: err.Error()}
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, &Error{File: path, Msg: err.Error()}
	}
	defer f.Close()
	// The file may have changed between Stat and Open: check what was
	// opened too.
	if info, err = f.Stat(); err != nil {
		return nil, &Error{File: path, Msg: err.Error()}
	}
	if err := checkFileInfo(info); err != nil {
		return nil, &Error{File: path, Msg: err.Error()}
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, &Error{File: path, Msg: err.Error()}
	}
	if len(data) > MaxFileSize {
		return nil, &Error{File: path, Msg: fmt.Sprintf("file is more than %d bytes", MaxFileSize)}
	}
	if data == nil {
		data = []byte{}
	}
	return data, nil
}

// checkFileInfo refuses what ReadFile does not read.
func checkFileInfo(info os.FileInfo) error {
	switch m := info.Mode(); {
	case m.IsDir():
		return fmt.Errorf("is a directory")
	case !m.IsRegular():
		return fmt.Errorf("not a regular file (%s); a rules file is a regular file", fileKind(m))
	case info.Size() > MaxFileSize:
		return fmt.Errorf("file is %d bytes; at most %d", info.Size(), MaxFileSize)
	}
	return nil
}

func fileKind(m os.FileMode) string {
	switch {
	case m&os.ModeNamedPipe != 0:
		return "a named pipe"
	case m&os.ModeSocket != 0:
		return "a socket"
	case m&os.ModeCharDevice != 0:
		return "a character device"
	case m&os.ModeDevice != 0:
		return "a device"
	}
	return "mode " + m.String()
}
