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
	var co rueidis.ClientOption
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return co, fmt.Errorf("redisstore: store URL %q: want scheme://host:port (redis, rediss, redis-sentinel or redis-cluster) or unix:///path", redact(raw))
	}
	switch scheme {
	case "redis", "rediss":
		// a host must be named: rueidis takes none as 127.0.0.1:6379,
		// which may well be some other Redis
		host := rest
		if at := strings.LastIndex(host, "@"); at >= 0 {
			host = host[at+1:]
		}
		if host, _, _ = strings.Cut(host, "/"); host == "" || strings.HasPrefix(host, ":") || strings.HasPrefix(host, "?") {
			return co, fmt.Errorf("redisstore: store URL %s: no host; want %s://host:port", redact(raw), scheme)
		}
		if _, query, ok := strings.Cut(rest, "?"); ok {
			q, err := url.ParseQuery(query)
			if err != nil {
				return co, fmt.Errorf("redisstore: store URL %s: query: %w", redact(raw), err)
			}
			for k := range q {
				if !slices.Contains(redisURLParams, k) {
					return co, fmt.Errorf("redisstore: store URL %s: unknown parameter %q (known: %s)", redact(raw), k, strings.Join(redisURLParams, ", "))
				}
			}
		}
		co, err := rueidis.ParseURL(raw)
		if err != nil {
			return co, fmt.Errorf("redisstore: store URL %s: %s", redact(raw), strings.ReplaceAll(err.Error(), raw, redact(raw)))
		}
		return co, nil
	case "unix":
		// unix:///path/to/redis.sock[?db=N]: a Redis on this host, over
		// its Unix socket (unixsocket in redis.conf)
		u, err := url.Parse(raw)
		if err != nil {
			return co, fmt.Errorf("redisstore: store URL %s: %s", redact(raw), strings.ReplaceAll(err.Error(), raw, redact(raw)))
		}
		if u.Host != "" || !strings.HasPrefix(u.Path, "/") || strings.HasSuffix(u.Path, "/") {
			return co, fmt.Errorf("redisstore: store URL %s: want unix:///absolute/path/to/redis.sock", redact(raw))
		}
		for k := range u.Query() {
			if k != "db" {
				return co, fmt.Errorf("redisstore: store URL %s: unknown parameter %q", redact(raw), k)
			}
		}
		co, err = rueidis.ParseURL(raw)
		if err != nil {
			return co, fmt.Errorf("redisstore: store URL %s: %s", redact(raw), strings.ReplaceAll(err.Error(), raw, redact(raw)))
		}
		if co.SelectDB < 0 {
			return co, fmt.Errorf("redisstore: store URL %s: db=%q is not a database number", redact(raw), u.Query().Get("db"))
		}
		return co, nil
	case "redis-sentinel", "redis-cluster":
	default:
		return co, fmt.Errorf("redisstore: store URL %s: unknown scheme %q (want redis, rediss, redis-sentinel, redis-cluster or unix)", redact(raw), scheme)
	}
	// url.Parse cannot read several host:port pairs, so split by hand:
	// [user[:password]@]host:port[,host:port...][/path][?query]
	rest, query, _ := strings.Cut(rest, "?")
	authority, path, _ := strings.Cut(rest, "/")
	if at := strings.LastIndex(authority, "@"); at >= 0 {
		user, pass, _ := strings.Cut(authority[:at], ":")
		var err error
		if co.Username, err = url.PathUnescape(user); err != nil {
			return co, fmt.Errorf("redisstore: store URL %s: user name: %w", redact(raw), err)
		}
		if co.Password, err = url.PathUnescape(pass); err != nil {
			return co, fmt.Errorf("redisstore: store URL %s: bad escape in the password", redact(raw))
		}
		authority = authority[at+1:]
	}
	if authority == "" {
		return co, fmt.Errorf("redisstore: store URL %s: no host", redact(raw))
	}
	for _, hp := range strings.Split(authority, ",") {
		if _, port, err := net.SplitHostPort(hp); err != nil || port == "" {
			return co, fmt.Errorf("redisstore: store URL %s: %q is not host:port", redact(raw), hp)
		}
		co.InitAddress = append(co.InitAddress, hp)
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
	q, err := url.ParseQuery(query)
	if err != nil {
		return co, fmt.Errorf("redisstore: store URL %s: query: %w", redact(raw), err)
	}
	for k := range q {
		if k != "db" {
			return co, fmt.Errorf("redisstore: store URL %s: unknown parameter %q", redact(raw), k)
		}
	}
	if db := q.Get("db"); db != "" {
		n, err := strconv.Atoi(db)
		if err != nil || n < 0 {
			return co, fmt.Errorf("redisstore: store URL %s: db=%q is not a database number", redact(raw), db)
		}
		if scheme == "redis-cluster" && n != 0 {
			return co, fmt.Errorf("redisstore: store URL %s: a cluster has no database number", redact(raw))
		}
		co.SelectDB = n
	}
	return co, nil
}

// redisURLParams are the query parameters a redis:// or rediss:// URL may
// carry, as rueidis reads them; any other (a misspelling, a go-redis
// option such as timeout) is refused rather than silently ignored.
var redisURLParams = []string{"db", "dial_timeout", "write_timeout", "protocol", "client_cache", "max_retries", "client_name", "skip_verify"}

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
