package clienttest_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/ration-dev/ration/client"
	"github.com/ration-dev/ration/client/clienttest"
)

// A handler limited by client.Middleware, tested with no agent: the fake
// keeps a bucket of 2 per user, refilled one an hour, as a rule
// "per-user" with burst 2 and rate 1/h would.
func Example() {
	// The clock stands still, so that the output does not depend on how
	// long the requests take (nil would be time.Now).
	stopped := func() time.Time { return time.Unix(0, 0) }
	fake := clienttest.New(clienttest.Bucket("per-user", 2, 1.0/3600, stopped))
	limit := client.Middleware(fake, func(r *http.Request) (client.Request, bool) {
		return client.Request{Descriptors: map[string]string{"user": r.Header.Get("X-User")}}, true
	}, client.MiddlewareOptions{})
	h := limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "hello")
	}))

	for i := 0; i < 3; i++ {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header.Set("X-User", "alice")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Printf("%d RateLimit: %s Retry-After: %q\n", w.Code, w.Header().Get("RateLimit"), w.Header().Get("Retry-After"))
	}
	fmt.Println(len(fake.Requests()), "requests asked")
	// Output:
	// 200 RateLimit: "per-user";r=1;t=3600 Retry-After: ""
	// 200 RateLimit: "per-user";r=0;t=7200 Retry-After: ""
	// 429 RateLimit: "per-user";r=0;t=7200 Retry-After: "3600"
	// 3 requests asked
}

// A bucket on the test's own clock: a spent quota comes back as time
// passes.
func ExampleBucket() {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	decide := clienttest.Bucket("per-user", 1, 1, func() time.Time { return now })
	alice := client.Request{Rule: "per-user", Subject: "alice"}

	d, _ := decide(alice)
	fmt.Println(d.Allowed, d.Remaining)
	d, _ = decide(alice)
	fmt.Println(d.Allowed, d.Reason, d.RetryAfter)
	now = now.Add(time.Second)
	d, _ = decide(alice)
	fmt.Println(d.Allowed, d.Remaining)
	// Output:
	// true 0
	// false over_limit 1s
	// true 0
}

// The agent unreachable: the middleware answers 503, or with FailOpen
// lets the request through.
func ExampleUnavailable() {
	fake := clienttest.New(clienttest.Unavailable())
	describe := func(r *http.Request) (client.Request, bool) {
		return client.Request{Descriptors: map[string]string{"path": r.URL.Path}}, true
	}
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})
	for _, failOpen := range []bool{false, true} {
		h := client.Middleware(fake, describe, client.MiddlewareOptions{FailOpen: failOpen})(ok)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
		fmt.Println("FailOpen", failOpen, "->", w.Code)
	}
	// Output:
	// FailOpen false -> 503
	// FailOpen true -> 200
}
