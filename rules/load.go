package rules

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// LoadDir loads every *.yaml and *.yml file in dir (not its
// subdirectories, nor names starting with '.', such as the "..data" links
// of a Kubernetes ConfigMap volume), one domain per file, in name order.
// A file with any error is refused whole and its errors reported; the
// other files load. A file whose domain an earlier file (by name) already
// defines is refused too. The Config is never nil.
func LoadDir(dir string) (*Config, []error) {
	return LoadDirWith(dir, Options{})
}

// LoadDirWith is LoadDir with options.
func LoadDirWith(dir string, opts Options) (*Config, []error) {
	var errs []error
	ents, err := os.ReadDir(dir)
	if err != nil {
		c, _ := NewConfig()
		return c, []error{fmt.Errorf("rules: %w", err)}
	}
	var names []string
	for _, e := range ents {
		n := e.Name()
		if strings.HasPrefix(n, ".") || !(strings.HasSuffix(n, ".yaml") || strings.HasSuffix(n, ".yml")) {
			continue
		}
		names = append(names, n)
	}
	sort.Strings(names)
	var domains []*Domain
	byName := map[string]*Domain{}
	for _, n := range names {
		path := filepath.Join(dir, n)
		data, err := readFile(path)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if data == nil {
			continue // a directory named *.yaml
		}
		d, err := ParseWith(path, data, opts)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if prev := byName[d.Name]; prev != nil {
			errs = append(errs, &Error{File: path, Field: "domain", Msg: fmt.Sprintf("domain %q is already defined in %s; a domain lives in one file", d.Name, prev.File)})
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

// readFile reads a rules file of at most MaxFileSize bytes; nil data (and
// no error) for a directory.
func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, &Error{File: path, Msg: err.Error()}
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return nil, &Error{File: path, Msg: err.Error()}
	}
	if info.IsDir() {
		return nil, nil
	}
	if info.Size() > MaxFileSize {
		return nil, &Error{File: path, Msg: fmt.Sprintf("file is %d bytes; at most %d", info.Size(), MaxFileSize)}
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
