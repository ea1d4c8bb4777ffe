package service

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate/memstore"
	"github.com/floodgate/floodgate/rules"
)

// One what-if at a time: while one runs (its slot taken here), another is
// answered 429 with Retry-After, and nothing is replayed; once it ends the
// next runs.
func TestWhatIfOneAtATime(t *testing.T) {
	cfg, err := rules.NewConfig()
	if err != nil {
		t.Fatal(err)
	}
	st := memstore.MustNew(memstore.Options{SweepInterval: -1})
	t.Cleanup(func() { st.Close() })
	s := New(cfg, Options{Store: st, Record: RecordOptions{Window: time.Minute}})
	h := s.AdminHandler("")
	post := func() *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("POST", "/v1/whatif", strings.NewReader("domain: d\n")))
		return w
	}
	s.whatIf <- struct{}{} // a what-if running
	if w := post(); w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != "1" || !strings.Contains(w.Body.String(), "one at a time") {
		t.Errorf("a second what-if: %d %v %s", w.Code, w.Header(), w.Body)
	}
	<-s.whatIf
	if w := post(); w.Code != http.StatusOK {
		t.Errorf("after it: %d %s", w.Code, w.Body)
	}
	if len(s.whatIf) != 0 {
		t.Error("a what-if kept its slot")
	}
}
