package holder_test

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/ration-dev/ration/internal/holder"
)

// unusedClient is a coordinator client that is never called: the test
// reads the holder's clock only.
type unusedClient struct{ holder.Client }

// The holder's clock counts every moment that passes, a pause of the whole
// process included: a lease's validity is measured on it, and a pause not
// counted would let the agent spend, after it resumes, a lease the
// coordinators already reclaimed and granted again. A clock that smoothed
// its jumps (a guard against clock steps, say) would do exactly that: the
// monotonic clock does not step, so there is nothing to guard against.
func TestNowCountsAPauseWhole(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, err := holder.New(holder.Options{Client: unusedClient{}, Holder: "a"})
		if err != nil {
			t.Fatal(err)
		}
		for _, gap := range []time.Duration{time.Millisecond, 150 * time.Millisecond, 3 * time.Second, time.Minute} {
			before := h.Now()
			time.Sleep(gap) // the process stopped, as by SIGSTOP: no reading in between
			if got := time.Duration(h.Now()-before) * time.Microsecond; got != gap {
				t.Errorf("Now advanced %v across a gap of %v, want all of it", got, gap)
			}
		}
	})
}
