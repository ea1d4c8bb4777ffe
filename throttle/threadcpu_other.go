//go:build !linux

package throttle

import (
	"net/http"
	"time"
)

const threadCPUSupported = false

func runThreadCPU(tk *Ticket, w http.ResponseWriter, r *http.Request, next http.Handler) {
	defer tk.Done()
	next.ServeHTTP(w, r)
}

func processCPU() time.Duration { return -1 }
