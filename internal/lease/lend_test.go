package lease

import "testing"

// TestHoldingLend checks the holder rule for lent tokens: they count
// against the cap until repaid, a shrink below them is not confirmed, and
// repaid tokens come back only within the cap and while the lease is
// valid.
func TestHoldingLend(t *testing.T) {
	h := Holding{Quota: "q", Lease: Lease{ID: 1, Quota: "q", Cap: 10, Rate: 10}, Balance: 10, ValidUntil: 100 * sec}
	if !h.Lend(0, 8) || h.Balance != 2 || h.Lent != 8 {
		t.Fatalf("lend 8 of 10: balance %v, lent %v", h.Balance, h.Lent)
	}
	if h.Lend(0, 3) {
		t.Fatal("lent 3 with 2 in the balance")
	}
	// A second later the rate gave 10, but only 2 fit beside what is lent.
	if got := h.Available(sec); got != 2 {
		t.Fatalf("refilled to %v beside 8 lent, want 2 (cap 10)", got)
	}
	// The delegate spent 5 of 8: 3 come back, within the cap.
	h.Repay(sec, 8, 3)
	if h.Lent != 0 || h.Balance != 5 {
		t.Fatalf("after repaying 8 (3 back): balance %v, lent %v, want 5, 0", h.Balance, h.Lent)
	}
	// A shrink to cap 4 with 6 lent: nothing fits, the shrink is not
	// confirmed while the loan is out.
	h.Lend(sec, 5)
	h.Lend(sec, 0.5)
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
	h.Repay(sec, 5.5, 0)
	if it := h.Renewal(sec, 9, 1, 0); it.ConfirmedCap != 4 {
		t.Fatalf("confirmed cap %v once repaid, want 4", it.ConfirmedCap)
	}
	// Repaid after the lease ran out: nothing comes back.
	h.Lend(2*sec, 1)
	h.Repay(200*sec, 1, 1)
	if h.Available(200*sec) != 0 || h.Lent != 0 {
		t.Fatalf("repaid into an expired lease: balance %v, lent %v", h.Balance, h.Lent)
	}
}
