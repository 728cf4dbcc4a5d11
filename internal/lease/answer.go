package lease

import "fmt"

// answer is a holder command's answer as recorded for replay. It is part of
// the snapshot, so errors are kept as codes.
type answer struct {
	Kind     Kind         `json:"kind"`
	Code     code         `json:"code,omitempty"`
	Lease    *Lease       `json:"lease,omitempty"`
	Items    []itemAnswer `json:"items,omitempty"`
	LeaseID  uint64       `json:"lease_id,omitempty"`
	Credited float64      `json:"credited,omitempty"`
}

type itemAnswer struct {
	LeaseID  uint64  `json:"lease_id"`
	Quota    string  `json:"quota"`
	Code     code    `json:"code,omitempty"`
	Lease    *Lease  `json:"lease,omitempty"`
	Credited float64 `json:"credited,omitempty"`
}

// result builds the caller's copy of an answer; it shares nothing with the
// state, so callers may keep or change it.
func (a answer) result(holder string) (Result, error) {
	var r Result
	switch a.Kind {
	case KindGrant:
		if a.Lease != nil {
			l := *a.Lease
			r.Lease = &l
		}
	case KindRenew:
		r.Items = make([]ItemResult, len(a.Items))
		for i, it := range a.Items {
			ir := ItemResult{LeaseID: it.LeaseID, Quota: it.Quota, Credited: it.Credited}
			if it.Lease != nil {
				l := *it.Lease
				ir.Lease = &l
			}
			if it.Code != codeOK {
				ir.Err = it.Code.err(fmt.Sprintf("renew %d (quota %q) by %q", it.LeaseID, it.Quota, holder))
			}
			r.Items[i] = ir
		}
	case KindRelease:
		r.Credited = a.Credited
	}
	if a.Code == codeOK {
		return r, nil
	}
	return r, a.Code.err(fmt.Sprintf("%s %d by %q", a.Kind, a.LeaseID, holder))
}

func (a answer) clone() answer {
	if a.Lease != nil {
		l := *a.Lease
		a.Lease = &l
	}
	if a.Items != nil {
		items := make([]itemAnswer, len(a.Items))
		for i, it := range a.Items {
			if it.Lease != nil {
				l := *it.Lease
				it.Lease = &l
			}
			items[i] = it
		}
		a.Items = items
	}
	return a
}
