package redisstore_test

import (
	"fmt"
	"testing"

	"github.com/floodgate/floodgate/redisstore"
)

// parsed is what a test compares of ParseURL's answer: its error, or the
// options a store URL sets.
func parsed(u string) string {
	co, err := redisstore.ParseURL(u)
	if err != nil {
		return "error: " + err.Error()
	}
	return fmt.Sprintf("addrs=%q user=%q pass=%q db=%d tls=%t master=%q suser=%q spass=%q refresh=%v",
		co.InitAddress, co.Username, co.Password, co.SelectDB, co.TLSConfig != nil,
		co.Sentinel.MasterSet, co.Sentinel.Username, co.Sentinel.Password, co.Sentinel.TopologyRefreshInterval)
}

// ParseURL's answers, every scheme and the errors of each, word for word.
func TestParseURLAnswers(t *testing.T) {
	for _, c := range urlAnswers {
		if got := parsed(c[0]); got != c[1] {
			t.Errorf("ParseURL(%q)\n got %s\nwant %s", c[0], got, c[1])
		}
	}
}

var urlAnswers = [][2]string{
	{"localhost:6379", "error: redisstore: store URL \"localhost:6379\": want scheme://host:port (redis, rediss, redis-sentinel or redis-cluster) or unix:///path"},
	{"redis://127.0.0.1:6380", "addrs=[\"127.0.0.1:6380\"] user=\"\" pass=\"\" db=0 tls=false master=\"\" suser=\"\" spass=\"\" refresh=0s"},
	{"redis://u:p@h:1/2", "addrs=[\"h:1\"] user=\"u\" pass=\"p\" db=2 tls=false master=\"\" suser=\"\" spass=\"\" refresh=0s"},
	{"rediss://u:p%40x@h:1/3?dial_timeout=1s", "addrs=[\"h:1\"] user=\"u\" pass=\"p@x\" db=3 tls=true master=\"\" suser=\"\" spass=\"\" refresh=0s"},
	{"redis://h:1?timeout=1s", "error: redisstore: store URL redis://h:1?timeout=1s: unknown parameter \"timeout\" (known: db, dial_timeout, write_timeout, protocol, client_cache, max_retries, client_name, skip_verify)"},
	{"redis://h:1?db=%zz", "error: redisstore: store URL redis://h:1?db=%zz: query: invalid URL escape \"%zz\""},
	{"redis://h:1/x", "error: redisstore: store URL redis://h:1/x: redis: invalid database number: \"x\""},
	{"redis://", "error: redisstore: store URL redis://: no host; want redis://host:port"},
	{"redis://:6380", "error: redisstore: store URL redis://:6380: no host; want redis://host:port"},
	{"http://h:1", "error: redisstore: store URL http://h:1: unknown scheme \"http\" (want redis, rediss, redis-sentinel, redis-cluster or unix)"},
	{"unix:///run/redis.sock", "addrs=[\"/run/redis.sock\"] user=\"\" pass=\"\" db=0 tls=false master=\"\" suser=\"\" spass=\"\" refresh=0s"},
	{"unix:///run/redis.sock?db=2", "addrs=[\"/run/redis.sock\"] user=\"\" pass=\"\" db=2 tls=false master=\"\" suser=\"\" spass=\"\" refresh=0s"},
	{"unix:///run/redis.sock?db=-1", "error: redisstore: store URL unix:///run/redis.sock?db=-1: db=\"-1\" is not a database number"},
	{"unix:///run/redis.sock?db=x", "error: redisstore: store URL unix:///run/redis.sock?db=x: redis: invalid database number: \"x\""},
	{"unix:///run/redis.sock?x=1", "error: redisstore: store URL unix:///run/redis.sock?x=1: unknown parameter \"x\""},
	{"unix://h/run/redis.sock", "error: redisstore: store URL unix://h/run/redis.sock: want unix:///absolute/path/to/redis.sock"},
	{"unix:///run/", "error: redisstore: store URL unix:///run/: want unix:///absolute/path/to/redis.sock"},
	{"unix://%zz", "error: redisstore: store URL unix://%zz: parse \"unix://%zz\": invalid URL escape \"%zz\""},
	{"redis-sentinel://:secret@10.0.0.1:26379,10.0.0.2:26379/mymaster?db=2", "addrs=[\"10.0.0.1:26379\" \"10.0.0.2:26379\"] user=\"\" pass=\"secret\" db=2 tls=false master=\"mymaster\" suser=\"\" spass=\"secret\" refresh=1s"},
	{"redis-sentinel://user:secret@10.0.0.1:26379/mymaster/", "addrs=[\"10.0.0.1:26379\"] user=\"user\" pass=\"secret\" db=0 tls=false master=\"mymaster\" suser=\"user\" spass=\"secret\" refresh=1s"},
	{"redis-sentinel://10.0.0.1:26379", "error: redisstore: store URL redis-sentinel://10.0.0.1:26379: name the master after the hosts: redis-sentinel://host:port/master-name"},
	{"redis-sentinel://10.0.0.1:26379/m?db=x", "error: redisstore: store URL redis-sentinel://10.0.0.1:26379/m?db=x: db=\"x\" is not a database number"},
	{"redis-sentinel://10.0.0.1:26379/m?db=-1", "error: redisstore: store URL redis-sentinel://10.0.0.1:26379/m?db=-1: db=\"-1\" is not a database number"},
	{"redis-sentinel://10.0.0.1:26379/m?foo=1", "error: redisstore: store URL redis-sentinel://10.0.0.1:26379/m?foo=1: unknown parameter \"foo\""},
	{"redis-sentinel://10.0.0.1:26379/m?db=%zz", "error: redisstore: store URL redis-sentinel://10.0.0.1:26379/m?db=%zz: query: invalid URL escape \"%zz\""},
	{"redis-sentinel://%zz:pw@10.0.0.1:26379/m", "error: redisstore: store URL redis-sentinel://%zz:xxxxx@10.0.0.1:26379/m: user name: invalid URL escape \"%zz\""},
	{"redis-sentinel://u:%zz@10.0.0.1:26379/m", "error: redisstore: store URL redis-sentinel://u:xxxxx@10.0.0.1:26379/m: bad escape in the password"},
	{"redis-sentinel://u:pw@/m", "error: redisstore: store URL redis-sentinel://u:xxxxx@/m: no host"},
	{"redis-sentinel://10.0.0.1/m", "error: redisstore: store URL redis-sentinel://10.0.0.1/m: \"10.0.0.1\" is not host:port"},
	{"redis-sentinel://10.0.0.1:/m", "error: redisstore: store URL redis-sentinel://10.0.0.1:/m: \"10.0.0.1:\" is not host:port"},
	{"redis-cluster://a:1,b:2,c:3", "addrs=[\"a:1\" \"b:2\" \"c:3\"] user=\"\" pass=\"\" db=0 tls=false master=\"\" suser=\"\" spass=\"\" refresh=0s"},
	{"redis-cluster://user:hunter2@127.0.0.1:1,bad", "error: redisstore: store URL redis-cluster://user:xxxxx@127.0.0.1:1,bad: \"bad\" is not host:port"},
	{"redis-cluster://a:1/3", "error: redisstore: store URL redis-cluster://a:1/3: a cluster has no database number"},
	{"redis-cluster://a:1/", "addrs=[\"a:1\"] user=\"\" pass=\"\" db=0 tls=false master=\"\" suser=\"\" spass=\"\" refresh=0s"},
	{"redis-cluster://a:1?db=0", "addrs=[\"a:1\"] user=\"\" pass=\"\" db=0 tls=false master=\"\" suser=\"\" spass=\"\" refresh=0s"},
	{"redis-cluster://a:1?db=1", "error: redisstore: store URL redis-cluster://a:1?db=1: a cluster has no database number"},
	{"redis-cluster://a:1?db=x", "error: redisstore: store URL redis-cluster://a:1?db=x: db=\"x\" is not a database number"},
	{"redis-cluster:///", "error: redisstore: store URL redis-cluster:///: no host"},
}
