package httplimit

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/floodgate/floodgate/gate"
)

// DeferPollPrefix is the path under which the middleware answers polls of
// deferred requests: DeferPollPrefix + queue name + "/" + id (package
// deferq's PollPrefix).
const DeferPollPrefix = "/_floodgate/deferred/"

// A Deferrer queues requests for later; *deferq.Queue is one (this package
// does not import it, so that a net/http user compiles no Redis client).
type Deferrer interface {
	// Name is the queue's name, the segment after DeferPollPrefix.
	Name() string
	// Accept queues r and answers 202 Accepted with the poll Location,
	// or 503 when the queue is full.
	Accept(w http.ResponseWriter, r *http.Request)
	// ServeHTTP answers a poll of DeferPollPrefix + Name() + "/ID".
	ServeHTTP(w http.ResponseWriter, r *http.Request)
}

// checkDefer checks that every Defer limit of g has a queue, and indexes
// the queues by name for the poll path.
func checkDefer(g *gate.Gate, queues map[string]Deferrer) (map[string]Deferrer, error) {
	byName := map[string]Deferrer{}
	for _, q := range queues {
		if q == nil {
			return nil, fmt.Errorf("httplimit: Options.Defer holds a nil queue")
		}
		byName[q.Name()] = q
	}
	for _, l := range g.Limits() {
		if l.Action == gate.Defer && queues[l.Name] == nil {
			return nil, fmt.Errorf("httplimit: limit %q has action defer but Options.Defer has no queue for it", l.Name)
		}
	}
	return byName, nil
}

// servePoll answers r if it is a poll of one of the queues.
func (m *Middleware) servePoll(w http.ResponseWriter, r *http.Request) bool {
	rest, ok := strings.CutPrefix(r.URL.Path, DeferPollPrefix)
	if !ok || len(m.polls) == 0 {
		return false
	}
	name := rest
	if i := strings.LastIndexByte(rest, '/'); i >= 0 {
		name = rest[:i] // ids hold no '/'; names may
	}
	if q := m.polls[name]; q != nil {
		q.ServeHTTP(w, r)
	} else {
		http.NotFound(w, r)
	}
	return true
}
