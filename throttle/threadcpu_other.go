//go:build !linux

package throttle

import "net/http"

const threadCPUSupported = false

func runThreadCPU(tk *Ticket, w http.ResponseWriter, r *http.Request, next http.Handler) {
	defer tk.Done()
	next.ServeHTTP(w, r)
}
