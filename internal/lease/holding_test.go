package lease

import "testing"

func TestAgentValidity(t *testing.T) {
	tests := []struct {
		term  int64
		drift float64
		pause int64
		want  int64
	}{
		{10 * sec, 0, 0, 10 * sec},
		{10 * sec, 0.01, 0, 9801980},    // 10s * 0.99/1.01
		{10 * sec, 0.01, 5000, 9796980}, // minus the pause
		{10 * sec, 0, 11 * sec, 0},      // never negative
		{10 * sec, 1, 0, 0},             // nonsense drift: no validity
		{10 * sec, -0.1, 0, 0},
	}
	for _, tt := range tests {
		if got := AgentValidity(tt.term, tt.drift, tt.pause); got != tt.want {
			t.Errorf("AgentValidity(%d, %v, %d) = %d, want %d", tt.term, tt.drift, tt.pause, got, tt.want)
		}
	}
}

// TestHoldingWithState runs one holder against the state machine, checking
// the holder's rules: validity from the send time, refill at the adopted
// rate up to the adopted cap, owed tokens after a shrink, answers to older
// commands ignored.
func TestHoldingWithState(t *testing.T) {
	s := New()
	mustApply := func(c Command) Result {
		t.Helper()
		r, err := s.Apply(c)
		if err != nil {
			t.Fatalf("Apply(%+v) = %v", c, err)
		}
		if err := s.CheckInvariants(); err != nil {
			t.Fatal(err)
		}
		return r
	}
	mustApply(quotaQ(0))
	h := &Holding{Quota: "q"}
	if h.Spend(0, 1) {
		t.Fatal("spent before any grant")
	}

	// Sent at 0, applied at 1s: valid until 0 + 10s, not 1s + 10s.
	g := h.Grant(0, "a", 1, 100)
	g.Now = sec
	r := mustApply(g)
	if !h.Adopt(sec, 1, *r.Lease) {
		t.Fatal("Adopt of the grant's answer refused")
	}
	if h.Adopt(sec, 1, *r.Lease) {
		t.Fatal("adopted a second copy of the same answer (a replay)")
	}
	if h.Balance != 100 || h.ValidUntil != 10*sec {
		t.Fatalf("after grant: balance %v, valid until %d; want 100, %d", h.Balance, h.ValidUntil, 10*sec)
	}
	if !h.Spend(2*sec, 100) || h.Spend(2*sec, 1) {
		t.Fatal("spend of the whole balance, then of one more token: want true, false")
	}
	if !h.Spend(3*sec, 10) || h.Spend(3*sec, 0.01) {
		t.Fatal("refill at rate 10 for 1s: want exactly 10 tokens")
	}

	// b arrives; a's renewal answers a shrink to 50, 5.
	mustApply(Grant{Now: 3 * sec, Holder: "b", Seq: 1, Quota: "q", Demand: 100})
	old := h.Renewal(4*sec, 2, 100, 0)  // balance 10
	item := h.Renewal(6*sec, 3, 100, 0) // resent with a newer seq; balance 30
	r = mustApply(Renew{Now: 4 * sec, Holder: "a", Seq: 2, Items: []RenewItem{old}})
	if h.Adopt(6*sec, 2, *r.Items[0].Lease) {
		t.Fatal("adopted the answer to an older command")
	}
	r = mustApply(Renew{Now: 6 * sec, Holder: "a", Seq: 3, Items: []RenewItem{item}})
	if l := r.Items[0].Lease; l.Cap != 50 || l.Rate != 5 {
		t.Fatalf("renewal answered cap %v rate %v, want 50, 5", l.Cap, l.Rate)
	}
	// Received at 9.5s, after refilling to 65 at the old rate: 15 above
	// the new cap are owed. Valid until 6s (sent) + 10s.
	if !h.Adopt(19*sec/2, 3, *r.Items[0].Lease) {
		t.Fatal("Adopt of the latest answer refused")
	}
	if h.Balance != 50 || h.Owed != 15 || h.ValidUntil != 16*sec {
		t.Fatalf("after shrink: balance %v owed %v valid until %d; want 50, 15, %d", h.Balance, h.Owed, h.ValidUntil, 16*sec)
	}
	next := h.Renewal(10*sec, 4, 100, 5)
	if next.Unused != 20 || next.ConfirmedCap != 50 || next.ConfirmedRate != 5 || h.Owed != 0 || h.Balance != 45 {
		t.Fatalf("renewal item %+v, balance %v owed %v; want unused 20 confirming 50, 5; balance 45", next, h.Balance, h.Owed)
	}
	r = mustApply(Renew{Now: 10 * sec, Holder: "a", Seq: 4, Items: []RenewItem{next}})
	if it := r.Items[0]; it.Err != nil || it.Credited != 20 {
		t.Fatalf("confirming renewal = %+v, want 20 credited", it)
	}

	// Past validity nothing is spent, refilled or reported.
	if h.Spend(16*sec, 1) {
		t.Fatal("spent after validity")
	}
	rel := h.Release(17*sec, "a", 5)
	if rel.Unused != 0 || rel.LeaseID != 1 {
		t.Fatalf("release after validity = %+v, want unused 0 for lease 1", rel)
	}
	h.Drop()
	if h.Valid(0) || h.Spend(0, 1) {
		t.Fatal("dropped holding still valid")
	}
}

func TestHoldingRelease(t *testing.T) {
	h := &Holding{Quota: "q"}
	h.Grant(0, "a", 1, 1)
	h.Adopt(0, 1, Lease{ID: 4, Quota: "q", Balance: 8, Cap: 10, Rate: 1, Term: 10 * sec})
	h.Owed = 2
	rel := h.Release(sec, "a", 2)
	if rel.Unused != 11 || rel.LeaseID != 4 || rel.Seq != 2 || rel.Holder != "a" {
		t.Fatalf("Release = %+v, want 9 balance + 2 owed for lease 4", rel)
	}
	if h.Valid(sec) || h.Spend(sec, 1) {
		t.Fatal("released holding still spends")
	}
	if h.Adopt(sec, 1, Lease{ID: 4, Quota: "q", Balance: 8, Cap: 10, Term: 10 * sec}) {
		t.Fatal("adopted a late grant answer after release")
	}
	if h.Adopt(sec, 2, Lease{ID: 4, Quota: "other", Cap: 10, Term: 10 * sec}) {
		t.Fatal("adopted another quota's lease")
	}
}
