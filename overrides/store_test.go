package overrides

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/floodgate/floodgate"
)

// testStore checks the Store contract on s, which must be empty.
func testStore(t *testing.T, s Store) {
	ctx := context.Background()
	t.Run("CRUD", func(t *testing.T) {
		if _, ok, err := s.Get(ctx, "api", "user=1"); ok || err != nil {
			t.Fatalf("empty store: %v %v", ok, err)
		}
		before := time.Now()
		o := Override{Domain: "api", Key: "user=1", Limit: 5, Period: time.Second, Note: "first"}
		if err := s.Put(ctx, o); err != nil {
			t.Fatal(err)
		}
		got, ok, err := s.Get(ctx, "api", "user=1")
		if err != nil || !ok {
			t.Fatalf("get: %v %v", ok, err)
		}
		if got.Updated.Before(before.Add(-time.Second)) || got.Updated.After(time.Now().Add(time.Second)) {
			t.Fatalf("Updated not stamped: %v", got.Updated)
		}
		o.Updated = got.Updated
		if got != o {
			t.Fatalf("got %+v, want %+v", got, o)
		}
		// Replace, keeping a given Updated.
		o2 := Override{Domain: "api", Key: "user=1", Limit: 50, Period: time.Minute, Burst: 80,
			Algorithm: floodgate.GCRA, Updated: time.Date(2024, 1, 2, 3, 4, 5, 6, time.UTC)}
		if err := s.Put(ctx, o2); err != nil {
			t.Fatal(err)
		}
		if got, _, _ := s.Get(ctx, "api", "user=1"); got != o2 {
			t.Fatalf("replaced: got %+v, want %+v", got, o2)
		}
		// Same key in another domain is another override.
		if _, ok, _ := s.Get(ctx, "web", "user=1"); ok {
			t.Fatal("override leaked across domains")
		}
		// Invalid overrides are refused, naming the field.
		err = s.Put(ctx, Override{Domain: "api", Key: "user=2", Limit: 0, Period: time.Second})
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != "limit" {
			t.Fatalf("invalid put: %v", err)
		}
		if found, err := s.Delete(ctx, "api", "user=1"); !found || err != nil {
			t.Fatalf("delete: %v %v", found, err)
		}
		if found, err := s.Delete(ctx, "api", "user=1"); found || err != nil {
			t.Fatalf("delete again: %v %v", found, err)
		}
		if _, ok, _ := s.Get(ctx, "api", "user=1"); ok {
			t.Fatal("deleted override still there")
		}
		if found, err := s.Delete(ctx, "nodomain", "x"); found || err != nil {
			t.Fatalf("delete in unknown domain: %v %v", found, err)
		}
		// Odd bytes in domains and keys.
		odd := Override{Domain: "{tag}%x y", Key: "k\x00{}é|%", Limit: 1, Period: time.Millisecond}
		if err := s.Put(ctx, odd); err != nil {
			t.Fatal(err)
		}
		if got, ok, _ := s.Get(ctx, odd.Domain, odd.Key); !ok || got.Limit != 1 {
			t.Fatalf("odd key: %+v %v", got, ok)
		}
		if _, ok, _ := s.Get(ctx, odd.Domain, "k"); ok {
			t.Fatal("prefix of a key found")
		}
		if found, _ := s.Delete(ctx, odd.Domain, odd.Key); !found {
			t.Fatal("odd key not deleted")
		}
	})
	t.Run("List", func(t *testing.T) {
		var batch []Override
		for i := range 2500 {
			batch = append(batch, Override{Domain: "list", Key: fmt.Sprintf("user=%05d", i), Limit: int64(i + 1), Period: time.Second})
		}
		batch = append(batch, Override{Domain: "other", Key: "user=00001", Limit: 1, Period: time.Second})
		if err := PutMany(ctx, s, batch); err != nil {
			t.Fatal(err)
		}
		var keys []string
		after := ""
		pages := 0
		for {
			page, err := s.List(ctx, "list", after, 700)
			if err != nil {
				t.Fatal(err)
			}
			pages++
			for _, o := range page {
				if o.Domain != "list" {
					t.Fatalf("wrong domain: %+v", o)
				}
				keys = append(keys, o.Key)
			}
			if len(page) < 700 {
				break
			}
			after = page[len(page)-1].Key
		}
		if len(keys) != 2500 || pages != 4 {
			t.Fatalf("%d keys in %d pages", len(keys), pages)
		}
		for i, k := range keys {
			if k != fmt.Sprintf("user=%05d", i) {
				t.Fatalf("keys[%d] = %q", i, k)
			}
		}
		if page, _ := s.List(ctx, "list", "", 0); len(page) != MaxListLimit {
			t.Fatalf("default limit: %d", len(page))
		}
		if page, _ := s.List(ctx, "list", "", 5000); len(page) != MaxListLimit {
			t.Fatalf("capped limit: %d", len(page))
		}
		// after need not be a key that exists.
		if page, _ := s.List(ctx, "list", "user=00041x", 2); len(page) != 2 || page[0].Key != "user=00042" || page[0].Limit != 43 {
			t.Fatalf("after a missing key: %+v", page)
		}
		if page, _ := s.List(ctx, "list", "user=02499", 10); len(page) != 0 {
			t.Fatalf("after the last: %+v", page)
		}
		if page, err := s.List(ctx, "nodomain", "", 10); len(page) != 0 || err != nil {
			t.Fatalf("unknown domain: %+v %v", page, err)
		}
		// PutMany is all or nothing on validation.
		err := PutMany(ctx, s, []Override{
			{Domain: "list", Key: "new", Limit: 1, Period: time.Second},
			{Domain: "list", Key: "bad", Limit: 1, Period: 0},
		})
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != "period" || fe.Key != "bad" {
			t.Fatalf("invalid batch: %v", err)
		}
		if _, ok, _ := s.Get(ctx, "list", "new"); ok {
			t.Fatal("part of an invalid batch written")
		}
	})
	t.Run("Concurrent", func(t *testing.T) {
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for w := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 50 {
					key := fmt.Sprintf("w%d-%d", w, i)
					if err := s.Put(ctx, Override{Domain: "conc", Key: key, Limit: int64(i + 1), Period: time.Second}); err != nil {
						errs <- err
						return
					}
					o, ok, err := s.Get(ctx, "conc", key)
					if err != nil || !ok || o.Limit != int64(i+1) {
						errs <- fmt.Errorf("get %s: %+v %v %v", key, o, ok, err)
						return
					}
					if _, err := s.List(ctx, "conc", "", 10); err != nil {
						errs <- err
						return
					}
					if i%2 == 0 {
						if found, err := s.Delete(ctx, "conc", key); !found || err != nil {
							errs <- fmt.Errorf("delete %s: %v %v", key, found, err)
							return
						}
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		n := 0
		for after := ""; ; {
			page, err := s.List(ctx, "conc", after, 0)
			if err != nil {
				t.Fatal(err)
			}
			n += len(page)
			if len(page) < MaxListLimit {
				break
			}
			after = page[len(page)-1].Key
		}
		if n != 8*25 {
			t.Fatalf("%d overrides left, want %d", n, 8*25)
		}
	})
}
