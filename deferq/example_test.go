package deferq_test

import (
	"context"
	"io"
	"log"
	"net/http"
	"os"
	"time"

	"github.com/floodgate/floodgate/deferq"
	"github.com/redis/rueidis"
)

// A service that queues POST /reports for later: each is answered 202
// with a Location to poll, and one worker per process delivers the queue
// to the report handler at 2 a second across all processes.
func Example() {
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{"127.0.0.1:6379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	q, err := deferq.New(c, deferq.Options{Name: "reports", Interval: 500 * time.Millisecond, MaxLen: 1000, ResultTTL: time.Hour})
	if err != nil {
		log.Fatal(err)
	}
	report := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// r carries Idempotency-Key: the same on a second delivery.
		io.WriteString(w, "report for "+r.URL.Query().Get("user")) //nolint:errcheck
	})
	host, _ := os.Hostname()
	go q.Run(context.Background(), host+"-"+os.Getenv("POD"), deferq.ToHandler(report, 1<<20)) //nolint:errcheck

	mux := http.NewServeMux()
	mux.HandleFunc("POST /reports", q.Accept) // 202 + Location, 503 when full
	mux.Handle("GET "+deferq.PollPrefix, q)   // 202 pending, the response when done, 404 after ResultTTL
	log.Fatal(http.ListenAndServe(":8080", mux))
}
