package redisstore

import (
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/rueidis"
)

// ParseURL turns a store URL (see New) into rueidis client options.
func ParseURL(raw string) (rueidis.ClientOption, error) {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return rueidis.ClientOption{}, fmt.Errorf("redisstore: store URL %q: want scheme://host:port (redis, rediss, redis-sentinel or redis-cluster) or unix:///path", redact(raw))
	}
	switch scheme {
	case "redis", "rediss":
		return parseRedisURL(raw, scheme, rest)
	case "unix":
		return parseUnixURL(raw)
	case "redis-sentinel", "redis-cluster":
		return parseHostsURL(raw, scheme, rest)
	}
	return rueidis.ClientOption{}, fmt.Errorf("redisstore: store URL %s: unknown scheme %q (want redis, rediss, redis-sentinel, redis-cluster or unix)", redact(raw), scheme)
}

// urlParams are the query parameters each scheme's URL may carry: for
// redis:// and rediss:// what rueidis reads; any other (a misspelling, a
// go-redis option such as timeout) is refused rather than silently ignored.
var urlParams = map[string][]string{
	"redis":          redisURLParams,
	"rediss":         redisURLParams,
	"unix":           {"db"},
	"redis-sentinel": {"db"},
	"redis-cluster":  {"db"},
}

var redisURLParams = []string{"db", "dial_timeout", "write_timeout", "protocol", "client_cache", "max_retries", "client_name", "skip_verify"}

// checkParams refuses a parameter of q that scheme's URLs do not take.
func checkParams(raw, scheme string, q url.Values) error {
	known := urlParams[scheme]
	for k := range q {
		if slices.Contains(known, k) {
			continue
		}
		if len(known) == 1 { // db alone: no list to give
			return fmt.Errorf("redisstore: store URL %s: unknown parameter %q", redact(raw), k)
		}
		return fmt.Errorf("redisstore: store URL %s: unknown parameter %q (known: %s)", redact(raw), k, strings.Join(known, ", "))
	}
	return nil
}

// parseQuery reads a URL's query and checks its parameters.
func parseQuery(raw, scheme, query string) (url.Values, error) {
	q, err := url.ParseQuery(query)
	if err != nil {
		return nil, fmt.Errorf("redisstore: store URL %s: query: %w", redact(raw), err)
	}
	return q, checkParams(raw, scheme, q)
}

// parseRedisURL reads redis://[user:password@]host:port[/db][?query] (or
// rediss://) as rueidis does, once it is sure a host is named: rueidis
// takes none as 127.0.0.1:6379, which may well be some other Redis.
func parseRedisURL(raw, scheme, rest string) (rueidis.ClientOption, error) {
	host := rest
	if at := strings.LastIndex(host, "@"); at >= 0 {
		host = host[at+1:]
	}
	if host, _, _ = strings.Cut(host, "/"); host == "" || strings.HasPrefix(host, ":") || strings.HasPrefix(host, "?") {
		return rueidis.ClientOption{}, fmt.Errorf("redisstore: store URL %s: no host; want %s://host:port", redact(raw), scheme)
	}
	if _, query, ok := strings.Cut(rest, "?"); ok {
		if _, err := parseQuery(raw, scheme, query); err != nil {
			return rueidis.ClientOption{}, err
		}
	}
	return rueidisURL(raw)
}

// rueidisURL is rueidis.ParseURL, with raw's password hidden in its errors.
func rueidisURL(raw string) (rueidis.ClientOption, error) {
	co, err := rueidis.ParseURL(raw)
	if err != nil {
		return co, fmt.Errorf("redisstore: store URL %s: %s", redact(raw), strings.ReplaceAll(err.Error(), raw, redact(raw)))
	}
	return co, nil
}

// parseUnixURL reads unix:///path/to/redis.sock[?db=N]: a Redis on this
// host, over its Unix socket (unixsocket in redis.conf).
func parseUnixURL(raw string) (rueidis.ClientOption, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return rueidis.ClientOption{}, fmt.Errorf("redisstore: store URL %s: %s", redact(raw), strings.ReplaceAll(err.Error(), raw, redact(raw)))
	}
	if u.Host != "" || !strings.HasPrefix(u.Path, "/") || strings.HasSuffix(u.Path, "/") {
		return rueidis.ClientOption{}, fmt.Errorf("redisstore: store URL %s: want unix:///absolute/path/to/redis.sock", redact(raw))
	}
	if err := checkParams(raw, "unix", u.Query()); err != nil {
		return rueidis.ClientOption{}, err
	}
	co, err := rueidisURL(raw)
	if err == nil && co.SelectDB < 0 {
		err = fmt.Errorf("redisstore: store URL %s: db=%q is not a database number", redact(raw), u.Query().Get("db"))
	}
	return co, err
}

// parseHostsURL reads a redis-sentinel:// or redis-cluster:// URL, which
// names several servers. url.Parse cannot read several host:port pairs, so
// it is split by hand:
//
//	[user[:password]@]host:port[,host:port...][/path][?query]
func parseHostsURL(raw, scheme, rest string) (rueidis.ClientOption, error) {
	var co rueidis.ClientOption
	rest, query, _ := strings.Cut(rest, "?")
	authority, path, _ := strings.Cut(rest, "/")
	hosts, err := parseUser(raw, authority, &co)
	if err != nil {
		return co, err
	}
	if co.InitAddress, err = parseHosts(raw, hosts); err != nil {
		return co, err
	}
	if scheme == "redis-sentinel" {
		co.Sentinel.MasterSet = strings.Trim(path, "/")
		if co.Sentinel.MasterSet == "" {
			return co, fmt.Errorf("redisstore: store URL %s: name the master after the hosts: redis-sentinel://host:port/master-name", redact(raw))
		}
		co.Sentinel.Username, co.Sentinel.Password = co.Username, co.Password
		co.Sentinel.TopologyRefreshInterval = sentinelRefresh
	} else if strings.Trim(path, "/") != "" {
		return co, fmt.Errorf("redisstore: store URL %s: a cluster has no database number", redact(raw))
	}
	q, err := parseQuery(raw, scheme, query)
	if err != nil {
		return co, err
	}
	co.SelectDB, err = parseDB(raw, scheme, q.Get("db"))
	return co, err
}

// parseUser sets co's user name and password from authority's
// user[:password]@, and returns the hosts after it.
func parseUser(raw, authority string, co *rueidis.ClientOption) (string, error) {
	at := strings.LastIndex(authority, "@")
	if at < 0 {
		return authority, nil
	}
	user, pass, _ := strings.Cut(authority[:at], ":")
	var err error
	if co.Username, err = url.PathUnescape(user); err != nil {
		return "", fmt.Errorf("redisstore: store URL %s: user name: %w", redact(raw), err)
	}
	if co.Password, err = url.PathUnescape(pass); err != nil {
		return "", fmt.Errorf("redisstore: store URL %s: bad escape in the password", redact(raw))
	}
	return authority[at+1:], nil
}

// parseHosts splits host:port[,host:port...].
func parseHosts(raw, hosts string) ([]string, error) {
	if hosts == "" {
		return nil, fmt.Errorf("redisstore: store URL %s: no host", redact(raw))
	}
	var addrs []string
	for _, hp := range strings.Split(hosts, ",") {
		if _, port, err := net.SplitHostPort(hp); err != nil || port == "" {
			return nil, fmt.Errorf("redisstore: store URL %s: %q is not host:port", redact(raw), hp)
		}
		addrs = append(addrs, hp)
	}
	return addrs, nil
}

// parseDB reads a db= parameter ("": 0); a cluster has database 0 alone.
func parseDB(raw, scheme, db string) (int, error) {
	if db == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(db)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("redisstore: store URL %s: db=%q is not a database number", redact(raw), db)
	}
	if scheme == "redis-cluster" && n != 0 {
		return 0, fmt.Errorf("redisstore: store URL %s: a cluster has no database number", redact(raw))
	}
	return n, nil
}

// redact hides the password of a store URL, for messages.
func redact(raw string) string {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return raw
	}
	authority, tail := rest, ""
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		authority, tail = rest[:i], rest[i:]
	}
	at := strings.LastIndex(authority, "@")
	if at < 0 {
		return raw
	}
	user, _, hasPass := strings.Cut(authority[:at], ":")
	if hasPass {
		user += ":xxxxx"
	}
	return scheme + "://" + user + "@" + authority[at+1:] + tail
}
