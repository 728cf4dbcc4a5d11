package lease

import "testing"

// TestHoldingLend checks the holder rule for lent tokens: they count
// against the cap until repaid, a shrink below them is not confirmed, and
// repaid tokens come back only within the cap and while the lease is
// valid.
func TestHoldingLend(t *testing.T) {
	h := Holding{Quota: "q", Lease: Lease{ID: 1, Quota: "q", Cap: 10, Rate: 10}, Balance: 10, ValidUntil: 100 * sec}
	if !h.Lend(0, 8, 0, 0) || h.Balance != 2 || h.Lent != 8 {
		t.Fatalf("lend 8 of 10: balance %v, lent %v", h.Balance, h.Lent)
	}
	if h.Lend(0, 3, 0, 0) {
		t.Fatal("lent 3 with 2 in the balance")
	}
	// A second later the rate gave 10, but only 2 fit beside what is lent.
	if got := h.Available(sec); got != 2 {
		t.Fatalf("refilled to %v beside 8 lent, want 2 (cap 10)", got)
	}
	// The delegate spent 5 of 8: 3 come back, within the cap.
	h.Repay(sec, 8, 0, 3)
	if h.Lent != 0 || h.Balance != 5 {
		t.Fatalf("after repaying 8 (3 back): balance %v, lent %v, want 5, 0", h.Balance, h.Lent)
	}
	// A shrink to cap 4 with 6 lent: nothing fits, the shrink is not
	// confirmed while the loan is out.
	h.Lend(sec, 5, 0, 0)
	h.Lend(sec, 0.5, 0, 0)
	h.sent(sec, 7)
	if !h.Adopt(sec, 7, Lease{ID: 1, Quota: "q", Cap: 4, Rate: 4}) {
		t.Fatal("answer not adopted")
	}
	if h.Balance != 0 || h.Owed != 0 {
		t.Fatalf("after the shrink: balance %v, owed %v, want 0, 0", h.Balance, h.Owed)
	}
	if it := h.Renewal(sec, 8, 1, 0); it.ConfirmedCap == 4 {
		t.Fatalf("confirmed cap 4 with %v lent", h.Lent)
	}
	h.Repay(sec, 5.5, 0, 0)
	if it := h.Renewal(sec, 9, 1, 0); it.ConfirmedCap != 4 {
		t.Fatalf("confirmed cap %v once repaid, want 4", it.ConfirmedCap)
	}
	// Repaid after the lease ran out: nothing comes back.
	h.Lend(2*sec, 1, 0, 0)
	h.Repay(200*sec, 1, 0, 1)
	if h.Available(200*sec) != 0 || h.Lent != 0 {
		t.Fatalf("repaid into an expired lease: balance %v, lent %v", h.Balance, h.Lent)
	}
}

// TestHoldingLendRate checks the holder rule for a lent refill rate: it is
// taken out of the bucket's own refill until repaid, a loan's rate must fit
// in the lease's rate beside the others' (a superseding loan counts the
// rate it supersedes once), and a renewal that lowers the rate below what
// is lent is not confirmed until the loans end.
func TestHoldingLendRate(t *testing.T) {
	h := Holding{Quota: "q", Lease: Lease{ID: 1, Quota: "q", Cap: 100, Rate: 10}, ValidUntil: 100 * sec}
	if !h.Lend(0, 0, 6, 0) || h.LentRate != 6 || h.Lent != 0 {
		t.Fatalf("lend rate 6 of 10: lent rate %v, lent %v", h.LentRate, h.Lent)
	}
	// The bucket refills at 10 - 6 = 4 a second.
	if got := h.Available(sec); got != 4 {
		t.Fatalf("a second after lending rate 6 of 10: %v tokens, want 4", got)
	}
	if h.Lend(sec, 0, 5, 0) || h.AvailableRate(sec) != 4 {
		t.Fatalf("lent rate 5 beside 6 of 10 (available %v)", h.AvailableRate(sec))
	}
	// Superseding the delegate's 6 with 9: counted once, as the larger.
	if !h.Lend(sec, 1, 9, 6) || h.LentRate != 9 || h.Balance != 3 {
		t.Fatalf("supersede 6 with 9: lent rate %v, balance %v, want 9, 3", h.LentRate, h.Balance)
	}
	// ... but what stays lent must fit: 9 - 6 + 8 > 10.
	if h.Lend(sec, 0, 8, 6) {
		t.Fatal("superseded 6 with 8 beside 9 lent, of 10")
	}
	// A shrink of the rate to 5 under 9 lent: the bucket refills at 0,
	// and the renewal does not confirm rate 5.
	h.sent(sec, 7)
	if !h.Adopt(sec, 7, Lease{ID: 1, Quota: "q", Cap: 100, Rate: 5, Term: 100 * sec}) {
		t.Fatal("answer not adopted")
	}
	if got := h.Available(2 * sec); got != 3 {
		t.Fatalf("refilled to %v with rate 9 lent of 5, want 3 (no refill)", got)
	}
	if it := h.Renewal(2*sec, 8, 1, 0); it.ConfirmedRate == 5 {
		t.Fatalf("confirmed rate 5 with %v lent", h.LentRate)
	}
	h.Repay(2*sec, 1, 9, 0)
	if it := h.Renewal(2*sec, 9, 1, 0); it.ConfirmedRate != 5 || h.LentRate != 0 {
		t.Fatalf("confirmed rate %v once repaid (lent rate %v), want 5", it.ConfirmedRate, h.LentRate)
	}
	if got := h.Available(3 * sec); got != 8 {
		t.Fatalf("a second after the rate came back: %v, want 3+5", got)
	}
	// Dropped: nothing stays lent.
	h.Lend(3*sec, 0, 5, 0)
	h.Drop()
	if h.LentRate != 0 || h.Lend(3*sec, 0, 1, 0) {
		t.Fatalf("after Drop: lent rate %v", h.LentRate)
	}
}
