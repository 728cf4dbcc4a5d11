package holder

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/lease"
	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

type noClient struct{}

func (noClient) Renew(context.Context, *rationv1.RenewRequest) (*rationv1.RenewResponse, error) {
	return nil, fmt.Errorf("not called")
}

func (noClient) Release(context.Context, *rationv1.ReleaseRequest) (*rationv1.ReleaseResponse, error) {
	return nil, fmt.Errorf("not called")
}

// When a quota is at its renew point, the quotas not due yet ride along
// only in the room the round's last request has left, the soonest due
// first: an agent of a few quotas still renews them all in one request
// per period, and one of 100,000 renews each once per period instead of
// all of them every round (which, fresh subjects arriving all the time,
// kept some quota always due, made every round 100 requests long, and let
// leases expire before their renewals went out).
func TestPiggybackFillsTheLastRequest(t *testing.T) {
	const sec = int64(time.Second / time.Microsecond)
	tests := []struct {
		name           string
		due, notDue    int
		maxItems, want int
	}{
		{"few quotas: all in one request", 1, 4, 10, 5},
		{"many quotas: the last request filled", 1, 29, 10, 10},
		{"many due: the last of three requests filled", 25, 30, 10, 30},
		{"due fill their requests exactly: nothing rides along", 20, 30, 10, 20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now := 100 * sec
			l, err := New(Options{Client: noClient{}, Holder: "a", MaxItems: tt.maxItems, Clock: func() int64 { return now }})
			if err != nil {
				t.Fatal(err)
			}
			term := 10 * sec
			mk := func(i int, renewIn int64) *quota {
				id := fmt.Sprintf("r|k=%d", i)
				q := &quota{rule: "r", subject: fmt.Sprintf("k=%d", i), id: id, own: true, lastUsed: now, sampledAt: now, reportedAt: now,
					h: lease.Holding{Quota: id, Validity: l.validity}}
				q.h.Lease = lease.Lease{ID: uint64(i + 1), Quota: id, Cap: 10, Rate: 1, Term: term}
				// renewAt = ValidUntil - validity*(1-RenewAt)
				q.h.ValidUntil = now + renewIn + int64(float64(l.validity(term))*(1-l.o.RenewAt))
				return q
			}
			var qs []*quota
			for i := range tt.due {
				qs = append(qs, mk(i, -sec))
			}
			soonest := map[*quota]bool{}
			for i := range tt.notDue {
				// Not due for 1..notDue seconds: i+1 seconds away.
				q := mk(tt.due+i, int64(i+1)*sec)
				qs = append(qs, q)
				if i < tt.want-tt.due {
					soonest[q] = true
				}
			}
			// The not-due first, so that scan order alone would pick the
			// wrong ones.
			qs = append(qs[tt.due:], qs[:tt.due]...)
			p, _ := l.look(qs, true, now, now+sec)
			if len(p.grants) != 0 || len(p.idle) != 0 {
				t.Fatalf("grants %d, idle %d: want neither", len(p.grants), len(p.idle))
			}
			if len(p.renews) != tt.want {
				t.Fatalf("%d due and %d not due, %d items a request: %d renewals, want %d", tt.due, tt.notDue, tt.maxItems, len(p.renews), tt.want)
			}
			for _, q := range p.renews {
				if q.h.ValidUntil > now+int64(float64(l.validity(term))*(1-l.o.RenewAt)) && !soonest[q] {
					t.Errorf("%s rides along, but sooner due quotas were left out", q.id)
				}
			}
		})
	}
}
