package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// The exit codes of the admin commands (inspect, reset, top, overrides),
// as `floodgate help CMD` lists them.
const (
	exitOK          = 0
	exitServer      = 1 // the server failed the call (5xx), or answered what the command cannot read
	exitUsage       = 2 // a bad flag or argument (key=value, an import file): nothing was sent
	exitNotFound    = 3 // 404: no limit matches the descriptor (an unknown domain, say), or no such override
	exitAuth        = 4 // 401: no or a wrong admin token; 429: too many wrong tokens from this address
	exitUnreachable = 5 // no answer: connection refused, a name that does not resolve, TLS failed, timeout
	exitRejected    = 6 // 400 or 413: the server refused what was sent, saying why (an override that cannot apply)
)

// exitCodesHelp is the table of exit codes, for each admin command's help.
const exitCodesHelp = `exit codes:
  0  done
  1  the server failed the call (5xx) or answered something unexpected
  2  usage: a bad flag, key=value or import file (nothing was sent)
  3  not found (404): no limit matches the descriptor (an unknown domain,
     say), or no such override
  4  not authorized: 401 (no or a wrong admin token) or 429 (too many wrong
     tokens from this address; wait and retry)
  5  the admin API did not answer: refused, unresolvable, TLS, timeout
  6  the server refused the request as bad (400, 413), saying why
`

// adminFlags are the flags every admin command takes: where the admin API
// is and how to reach it.
type adminFlags struct {
	admin      string
	token      string
	tokenFile  string
	ca         string
	cert, key  string
	serverName string
	insecure   bool
	timeout    time.Duration
	json       bool
}

// defaultAdminURL is serve's default admin address, as a URL.
const defaultAdminURL = "http://127.0.0.1:6070"

// defaultProxyAdminURL is proxy's default admin address, as a URL.
const defaultProxyAdminURL = "http://127.0.0.1:6071"

// register adds the admin flags to fs; withJSON adds --json too (for the
// commands whose output is a table).
func (f *adminFlags) register(fs *flag.FlagSet, withJSON bool) {
	f.registerAt(fs, withJSON, defaultAdminURL)
}

// registerAt is register with the admin API at defURL by default (the
// proxy's, for the commands only proxy answers).
func (f *adminFlags) registerAt(fs *flag.FlagSet, withJSON bool, defURL string) {
	fs.StringVar(&f.admin, "admin", envString("ADMIN_URL", defURL), "the admin API: http://HOST:PORT, https://HOST:PORT, HOST:PORT or unix:PATH [FLOODGATE_ADMIN_URL]")
	fs.StringVar(&f.token, "token", "", "the admin token (default: --token-file's, else $FLOODGATE_ADMIN_TOKEN, as serve reads it)")
	fs.StringVar(&f.tokenFile, "token-file", envString("ADMIN_TOKEN_FILE", ""), "read the admin token from this file (its first line) [FLOODGATE_ADMIN_TOKEN_FILE]")
	fs.StringVar(&f.ca, "ca", "", "PEM file of the CA to verify the admin API's certificate with (implies https)")
	fs.StringVar(&f.cert, "cert", "", "client certificate PEM file, for a server run with --tls-client-ca (with --key; implies https)")
	fs.StringVar(&f.key, "key", "", "client key PEM file")
	fs.StringVar(&f.serverName, "server-name", "", "the name to verify in the server's certificate (default: the host of --admin)")
	fs.BoolVar(&f.insecure, "insecure", false, "do not verify the server's certificate")
	fs.DurationVar(&f.timeout, "timeout", 10*time.Second, "deadline of each call")
	if withJSON {
		fs.BoolVar(&f.json, "json", false, "print JSON (one document) instead of a table")
	}
}

// adminClient calls one admin API.
type adminClient struct {
	base    url.URL // scheme and host: http(s)://HOST:PORT
	hc      *http.Client
	token   string
	timeout time.Duration
	// clientCert says a client certificate is given (--cert)
	clientCert bool
}

// client checks the flags and makes the client: a usage error (exitUsage)
// when they do not go together or a file cannot be read.
func (f *adminFlags) client() (*adminClient, error) {
	tok, err := f.resolveToken()
	if err != nil {
		return nil, usageError(err)
	}
	if tok != "" && !visibleToken(tok) {
		return nil, usageError(errors.New("the admin token: want printable ASCII with no leading or trailing blanks, as serve's --admin-token"))
	}
	if (f.cert == "") != (f.key == "") {
		return nil, usageError(errors.New("--cert and --key go together"))
	}
	if f.timeout <= 0 {
		return nil, usageError(fmt.Errorf("--timeout %v: want more than 0", f.timeout))
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil // an admin API is reached directly, never through $HTTPS_PROXY
	base, unixPath, err := parseAdminURL(f.admin, f.ca != "" || f.cert != "" || f.insecure || f.serverName != "")
	if err != nil {
		return nil, usageError(err)
	}
	if unixPath != "" {
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", unixPath)
		}
	}
	if base.Scheme == "https" {
		if tr.TLSClientConfig, err = f.tlsConfig(); err != nil {
			return nil, usageError(err)
		}
	}
	// a redirect is not followed: the admin API makes none, and the token
	// is for this address alone
	hc := &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return &adminClient{base: *base, hc: hc, token: tok, timeout: f.timeout, clientCert: f.cert != ""}, nil
}

// resolveToken is --token, else the first line of --token-file (or
// $FLOODGATE_ADMIN_TOKEN_FILE), else $FLOODGATE_ADMIN_TOKEN (as serve
// reads it); "" for none.
func (f *adminFlags) resolveToken() (string, error) {
	if f.token != "" {
		return f.token, nil
	}
	if f.tokenFile == "" {
		return os.Getenv("FLOODGATE_ADMIN_TOKEN"), nil
	}
	b, err := os.ReadFile(f.tokenFile)
	if err != nil {
		return "", fmt.Errorf("--token-file: %w", err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	line = strings.TrimSpace(line)
	if line == "" {
		return "", fmt.Errorf("--token-file %s: the first line is empty", f.tokenFile)
	}
	return line, nil
}

// parseAdminURL reads --admin: a URL with scheme http or https, HOST:PORT
// (https when tlsWanted, else http) or unix:PATH (http over the socket,
// returned as unixPath).
func parseAdminURL(s string, tlsWanted bool) (base *url.URL, unixPath string, err error) {
	scheme := "http"
	if tlsWanted {
		scheme = "https"
	}
	if p, ok := strings.CutPrefix(s, "unix:"); ok {
		if p == "" {
			return nil, "", errors.New("--admin unix:PATH: the path is empty")
		}
		return &url.URL{Scheme: scheme, Host: "floodgate-admin"}, p, nil
	}
	if !strings.Contains(s, "://") {
		s = scheme + "://" + s
	}
	u, err := url.Parse(s)
	if err != nil {
		return nil, "", fmt.Errorf("--admin %q: %v", s, err)
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, "", fmt.Errorf("--admin %q: want http://, https://, HOST:PORT or unix:PATH", s)
	case u.Host == "":
		return nil, "", fmt.Errorf("--admin %q: no host", s)
	case u.Path != "" && u.Path != "/":
		return nil, "", fmt.Errorf("--admin %q: give the listener's address only, not a path", s)
	case u.Scheme == "http" && tlsWanted:
		return nil, "", fmt.Errorf("--admin %q is plain http, but TLS flags were given: use https://", s)
	}
	return &url.URL{Scheme: u.Scheme, Host: u.Host}, "", nil
}

// tlsConfig is the client's TLS: --ca's roots (the system's without it),
// --cert and --key, --server-name, --insecure.
func (f *adminFlags) tlsConfig() (*tls.Config, error) {
	c := &tls.Config{ServerName: f.serverName, InsecureSkipVerify: f.insecure, MinVersion: tls.VersionTLS12}
	if f.ca != "" {
		pem, err := os.ReadFile(f.ca)
		if err != nil {
			return nil, fmt.Errorf("--ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--ca %s: no PEM certificate in it", f.ca)
		}
		c.RootCAs = pool
	}
	if f.cert != "" {
		kp, err := tls.LoadX509KeyPair(f.cert, f.key)
		if err != nil {
			return nil, fmt.Errorf("--cert/--key: %w", err)
		}
		c.Certificates = []tls.Certificate{kp}
	}
	return c, nil
}

// An adminError is an admin command's failure: what to print and the exit
// code.
type adminError struct {
	code   int
	msg    string
	detail string // the server's message, when it gave one
	index  *int   // a bulk call's bad override, when the server named it
	field  string // and its field
}

// bulkIndex is the index and field of the override a bulk call refused.
func (e *adminError) bulkIndex() (int, string, bool) {
	if e.index == nil {
		return 0, "", false
	}
	return *e.index, e.field, true
}

func (e *adminError) Error() string { return e.msg }

func usageError(err error) error { return &adminError{code: exitUsage, msg: err.Error()} }

// exitWith prints err for command cmd on stderr and returns its exit code.
func exitWith(stderr io.Writer, cmd string, err error) int {
	if err == nil {
		return exitOK
	}
	code := exitServer
	if ae, ok := errors.AsType[*adminError](err); ok {
		code = ae.code
	}
	fmt.Fprintf(stderr, "floodgate %s: %v\n", cmd, err)
	return code
}

// call sends one request (body, if not nil, as JSON) and decodes a 2xx
// answer's JSON into out (if not nil). Any other answer is an *adminError
// carrying the server's message and the exit code of its status.
func (c *adminClient) call(ctx context.Context, method, path string, query url.Values, body, out any) error {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	u := c.base
	u.Path, u.RawPath = pathUnescaped(path), path
	u.RawQuery = query.Encode()
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return c.unreachable(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return c.unreachable(err)
	}
	if resp.StatusCode/100 != 2 {
		return c.statusError(resp, data)
	}
	if out == nil || resp.StatusCode == http.StatusNoContent {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return &adminError{code: exitServer, msg: fmt.Sprintf("%s %s: the answer is not the JSON expected (%v): %.200q", method, u.Path, err, data)}
	}
	return nil
}

// pathUnescaped is the decoded form of an escaped path (for url.URL.Path).
func pathUnescaped(p string) string {
	if s, err := url.PathUnescape(p); err == nil {
		return s
	}
	return p
}

// unreachable explains a call that got no answer.
func (c *adminClient) unreachable(err error) error {
	msg := fmt.Sprintf("no answer from the admin API at %s: %v", c.base.String(), err)
	s := err.Error()
	switch {
	case strings.Contains(s, "certificate required") || strings.Contains(s, "bad certificate"):
		msg += "\n  (the server wants a client certificate: --cert FILE --key FILE, issued by its --tls-client-ca)"
	case c.base.Scheme == "https" && !c.clientCert && !strings.Contains(s, "x509:") && containsAny(s, "could not be established", "broken pipe", "EOF", "connection reset"):
		// TLS 1.3 sends a client's missing certificate's alert after the
		// handshake: the client sees whichever read or write fails first
		msg += "\n  (the connection was dropped after the TLS handshake: if the server runs with --tls-client-ca, give --cert FILE --key FILE)"
	case strings.Contains(s, "x509:") || strings.Contains(s, "certificate"):
		msg += "\n  (the server's certificate did not verify: give its CA with --ca FILE, and --server-name if it is issued for another name)"
	case strings.Contains(s, "server gave HTTP response to HTTPS client"):
		msg += "\n  (the server speaks plain HTTP: use http:// in --admin, without --ca)"
	case strings.Contains(s, "connection refused"):
		msg += "\n  (is `floodgate serve` running, and is --admin its --admin-addr?)"
	}
	return &adminError{code: exitUnreachable, msg: msg}
}

// statusError turns a non-2xx answer into an *adminError.
func (c *adminClient) statusError(resp *http.Response, data []byte) error {
	var e struct {
		Error string `json:"error"`
		Index *int   `json:"index"`
		Field string `json:"field"`
	}
	msg := strings.TrimSpace(string(data))
	if json.Unmarshal(data, &e) == nil && e.Error != "" {
		msg = e.Error
	}
	where := resp.Request.Method + " " + resp.Request.URL.Path
	switch code := resp.StatusCode; {
	case code == http.StatusUnauthorized || code == http.StatusForbidden:
		hint := "no admin token was given: set --token, FLOODGATE_ADMIN_TOKEN or --token-file"
		if c.token != "" {
			hint = "the admin token given is not the server's --admin-token"
		}
		return &adminError{code: exitAuth, msg: fmt.Sprintf("%s: %d %s: %s", where, code, http.StatusText(code), hint)}
	case code == http.StatusTooManyRequests:
		return &adminError{code: exitAuth, msg: fmt.Sprintf("%s: 429: too many wrong admin tokens from this address; retry after %ss with the right one", where, resp.Header.Get("Retry-After"))}
	case code == http.StatusNotFound:
		if !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
			msg = "the server has no such route (a floodgate older than this command?)"
		}
		return &adminError{code: exitNotFound, msg: fmt.Sprintf("%s: 404: %s", where, msg)}
	case code == http.StatusBadRequest && strings.Contains(msg, "HTTP request to an HTTPS server"):
		return &adminError{code: exitUnreachable, msg: fmt.Sprintf("the admin API at %s speaks TLS: use https:// in --admin (and --ca FILE for its CA)", c.base.String())}
	case code == http.StatusBadRequest || code == http.StatusRequestEntityTooLarge:
		return &adminError{code: exitRejected, msg: fmt.Sprintf("%s: %d: %s", where, code, msg), detail: msg, index: e.Index, field: e.Field}
	}
	return &adminError{code: exitServer, msg: fmt.Sprintf("%s: %d %s: %s", where, resp.StatusCode, http.StatusText(resp.StatusCode), msg), detail: msg}
}

// parseInterleaved parses args with fs, letting flags and positional
// arguments mix (`overrides set user=1 --limit 5`); "--" ends the flags.
// It returns the positional arguments in order.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := parseFlags(fs, args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if len(args) > len(rest) && args[len(args)-len(rest)-1] == "--" {
			return append(pos, rest...), nil // after "--": all positional
		}
		pos, args = append(pos, rest[0]), rest[1:]
	}
}

// parseEntries reads key=value arguments into a descriptor's entries, in
// order: a value may hold '=' (split at the first), a key may not be empty.
func parseEntries(args []string) ([]entry, error) {
	if len(args) == 0 {
		return nil, errors.New("no key=value given: name the descriptor, e.g. user=241531 (several for a nested one: route=r1 user=241531)")
	}
	out := make([]entry, 0, len(args))
	for _, a := range args {
		k, v, ok := strings.Cut(a, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%q: want key=value, e.g. user=241531", a)
		}
		out = append(out, entry{Key: k, Value: v})
	}
	return out, nil
}

// entry is one descriptor entry as the admin API takes it.
type entry struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// adminUsage prints a command's usage line, its flags and the exit codes.
func adminUsage(fs *flag.FlagSet, stderr io.Writer, usage string) func() {
	return func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
		fmt.Fprint(stderr, "\n"+exitCodesHelp)
	}
}

// flagExit is the exit code of a flag parsing error: 0 for -h, else 2.
func flagExit(err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	return exitUsage
}
