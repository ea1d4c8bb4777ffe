package main

import (
	"io"
	"net/http"
	"sync"
	"time"
)

// A bodyCutter lets SIGTERM's drain stop waiting for clients that are
// still sending a request body. http.Server.Shutdown waits for every
// active connection, and one whose client trickles a body (a byte a
// second against a Content-Length of 100,000) stays active until
// ReadTimeout, past the drain timeout. Requests whose bodies have been
// read are decided and answered as usual; those still reading get their
// connection's read deadline set to now, so the read fails, the handler
// answers 400 and the connection closes.
type bodyCutter struct {
	mu       sync.Mutex
	reading  map[*http.ResponseController]struct{}
	draining bool
}

// wrap registers each request of h while its body is being read.
func (c *bodyCutter) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody {
			h.ServeHTTP(w, r)
			return
		}
		rc := http.NewResponseController(w)
		c.mu.Lock()
		if c.draining {
			rc.SetReadDeadline(time.Now())
		} else {
			if c.reading == nil {
				c.reading = map[*http.ResponseController]struct{}{}
			}
			c.reading[rc] = struct{}{}
		}
		c.mu.Unlock()
		b := &cutBody{ReadCloser: r.Body, done: func() { c.done(rc) }}
		defer b.finish()
		r.Body = b
		h.ServeHTTP(w, r)
	})
}

func (c *bodyCutter) done(rc *http.ResponseController) {
	c.mu.Lock()
	delete(c.reading, rc)
	c.mu.Unlock()
}

// cut ends the body reads in progress, and any that start later.
func (c *bodyCutter) cut() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.draining = true
	for rc := range c.reading {
		rc.SetReadDeadline(time.Now()) // HTTP/2 cannot: its drain waits as before
	}
	clear(c.reading)
}

// cutBody is a request body that tells its cutter when it has been read
// to its end (or failed), once.
type cutBody struct {
	io.ReadCloser
	done func()
	once sync.Once
}

func (b *cutBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.finish()
	}
	return n, err
}

func (b *cutBody) finish() { b.once.Do(b.done) }
