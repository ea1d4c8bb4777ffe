// Command upstream is the HTTP server that bench/proxy.sh puts behind the
// proxies: it answers every GET with 200 and a short fixed body, keeps
// connections alive, and does nothing else (no logging, no routing), so that
// the proxy in front of it, not the upstream, is what the benchmark shows.
//
//	go run ./cmd/upstream -listen 127.0.0.1:8090
package main

import (
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"
)

var body = []byte("ok\n")

func handle(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	h := w.Header()
	// Setting both headers spares net/http the content sniffing.
	h["Content-Type"] = []string{"text/plain; charset=utf-8"}
	h["Content-Length"] = []string{"3"}
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodGet {
		w.Write(body)
	}
}

func main() {
	listen := flag.String("listen", "127.0.0.1:8090", "listen address (port 0: any free port, printed on stdout)")
	flag.Parse()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, "upstream:", err)
		os.Exit(1)
	}
	fmt.Println(ln.Addr())
	srv := &http.Server{
		Handler:           http.HandlerFunc(handle),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       5 * time.Minute,
	}
	if err := srv.Serve(ln); err != nil {
		fmt.Fprintln(os.Stderr, "upstream:", err)
		os.Exit(1)
	}
}
