package holder

import (
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/lease"
)

// An Envoy's requests arrive in one lump per reporting interval (Count
// with over = the interval): the demand a renewal reports between two
// lumps is the lumps' rate, not 0, and the second without a lump is not a
// fall. Read over 250ms windows, the empty ones reported a demand of 0
// and the agent's lease went to the quota's other agents.
func TestDemandOfLumpyCounts(t *testing.T) {
	const sec = int64(time.Second / time.Microsecond)
	q := &quota{rate: 20}
	// 200 requests a second, reported once a second, for 5 seconds.
	for i := int64(1); i <= 5; i++ {
		q.count(200, i*sec)
		q.lump = sec
		q.sample(i * sec)
		q.sample(i*sec + sec/2) // the scans between lumps
		if q.fell(i*sec + 3*sec/4) {
			t.Fatalf("at %ds + 0.75s, between two lumps: the demand read as fallen", i)
		}
	}
	if d := q.report(5*sec + 9*sec/10); d < 100 || d > 400 {
		t.Fatalf("demand reported 0.9s after the last lump of 200/s: %v, want about 200", d)
	}
	// Two intervals with no lump: a fall.
	if !q.fell(8 * sec) {
		t.Fatal("three seconds without a lump: want the demand fallen")
	}
}

// A delegate may report up to 2^40 requests at once: the demand a renewal
// carries stays within what the coordinator accepts (lease.MaxValue), or
// it refuses the renewal as invalid and the quota's lease is lost.
func TestReportedDemandIsBounded(t *testing.T) {
	const sec = int64(time.Second / time.Microsecond)
	q := &quota{rate: 20}
	for i := int64(1); i <= 3; i++ {
		q.count(8<<40, i*sec) // eight buckets at the most a report may count
		q.lump = sec
		q.sample(i * sec)
	}
	if d := q.report(3*sec + sec/2); !(d >= 0 && d <= lease.MaxValue) {
		t.Fatalf("demand reported after claims of 8 x 2^40 a second: %v, want within [0, %v]", d, float64(lease.MaxValue))
	}
}
