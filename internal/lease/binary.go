package lease

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// Renew's binary encoding (command version 4), after the type and version
// bytes:
//
//	renew: varint now | string holder | uvarint seq | uvarint items | items
//	item:  uvarint lease_id | string quota | f64 unused | f64 demand |
//	       f64 weight | bounds | f64 confirmed_cap | f64 confirmed_rate
//	bounds: 0x00 (none) | 0x01 varint period | f64 min_slice | f64 max_slice
//
// items is 0 for a nil list and n+1 for a list of n (so a nil and an empty
// list stay apart, as in JSON); varint is zigzag (binary.AppendVarint), both
// varint forms in their shortest encoding; string is a uvarint length and
// the bytes as they are; f64 is the IEEE 754 bits, little-endian, finite
// only. Every value has exactly one encoding, so whatever decodes re-encodes
// to the same bytes.

// minRenewItem is the fewest bytes an item takes: a one-byte lease id and
// quota length, five floats, the bounds byte.
const minRenewItem = 1 + 1 + 5*8 + 1

// appendRenew appends r's binary encoding, header included, to b.
func appendRenew(b []byte, r Renew) ([]byte, error) {
	size := 2 + 3*binary.MaxVarintLen64 + len(r.Holder) + binary.MaxVarintLen64
	for _, it := range r.Items {
		size += 2*binary.MaxVarintLen64 + len(it.Quota) + 5*8 + 1
		if it.Bounds != nil {
			size += binary.MaxVarintLen64 + 2*8
		}
	}
	if cap(b)-len(b) < size {
		b = append(make([]byte, 0, len(b)+size), b...)
	}
	b = append(b, byte(KindRenew), binaryVersion)
	b = binary.AppendVarint(b, r.Now)
	b = appendString(b, r.Holder)
	b = binary.AppendUvarint(b, r.Seq)
	if r.Items == nil {
		b = append(b, 0)
	} else {
		b = binary.AppendUvarint(b, uint64(len(r.Items))+1)
	}
	var err error
	f64 := func(b []byte, v float64, field string, i int) []byte {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			if err == nil {
				err = fmt.Errorf("lease: encode renew: %w: items[%d].%s is %v", ErrInvalid, i, field, v)
			}
			return b
		}
		return binary.LittleEndian.AppendUint64(b, math.Float64bits(v))
	}
	for i, it := range r.Items {
		b = binary.AppendUvarint(b, it.LeaseID)
		b = appendString(b, it.Quota)
		b = f64(b, it.Unused, "unused", i)
		b = f64(b, it.Demand, "demand", i)
		b = f64(b, it.Weight, "weight", i)
		if it.Bounds == nil {
			b = append(b, 0)
		} else {
			b = append(b, 1)
			b = binary.AppendVarint(b, it.Bounds.Period)
			b = f64(b, it.Bounds.MinSlice, "bounds.min_slice", i)
			b = f64(b, it.Bounds.MaxSlice, "bounds.max_slice", i)
		}
		b = f64(b, it.ConfirmedCap, "confirmed_cap", i)
		b = f64(b, it.ConfirmedRate, "confirmed_rate", i)
	}
	if err != nil {
		return nil, err
	}
	return b, nil
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// decodeRenew reads a version 4 Renew's body (after the two header bytes):
// all of it, strictly.
func decodeRenew(body []byte) (Renew, error) {
	d := decoder{b: body}
	r := Renew{Now: d.varint("now"), Holder: d.str("holder"), Seq: d.uvarint("seq")}
	n := d.uvarint("items")
	switch {
	case d.err != nil:
	case n-1 > uint64(len(d.b)/minRenewItem):
		// n-1 wraps for n 0 (nil); checked first, so that a corrupt count
		// cannot allocate more than the body could hold.
		if n != 0 {
			d.fail("items", fmt.Errorf("%d items in %d bytes", n-1, len(d.b)))
		}
	default:
		r.Items = make([]RenewItem, n-1)
		for i := range r.Items {
			it := &r.Items[i]
			it.LeaseID = d.uvarint("lease_id")
			it.Quota = d.str("quota")
			it.Unused = d.f64("unused")
			it.Demand = d.f64("demand")
			it.Weight = d.f64("weight")
			switch d.byte("bounds") {
			case 0:
			case 1:
				it.Bounds = &Bounds{Period: d.varint("bounds.period"), MinSlice: d.f64("bounds.min_slice"), MaxSlice: d.f64("bounds.max_slice")}
			default:
				d.fail("bounds", errors.New("marker not 0 or 1"))
			}
			it.ConfirmedCap = d.f64("confirmed_cap")
			it.ConfirmedRate = d.f64("confirmed_rate")
			if d.err != nil {
				break
			}
		}
	}
	if d.err == nil && len(d.b) != 0 {
		d.err = fmt.Errorf("%d bytes after the command", len(d.b))
	}
	if d.err != nil {
		return Renew{}, d.err
	}
	return r, nil
}

// decoder reads binary fields; the first error sticks and every later read
// returns a zero value.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(field string, err error) {
	if d.err == nil {
		d.err = fmt.Errorf("%s: %w", field, err)
	}
	d.b = nil
}

var errVarint = errors.New("varint truncated, too long, or not in its shortest form")

// shortest reports whether the k bytes of a varint that ended at b[k-1] are
// its shortest form: only a single zero byte may end in zero.
func shortest(b []byte, k int) bool { return k == 1 || b[k-1] != 0 }

func (d *decoder) uvarint(field string) uint64 {
	if d.err != nil {
		return 0
	}
	v, k := binary.Uvarint(d.b)
	if k <= 0 || !shortest(d.b, k) {
		d.fail(field, errVarint)
		return 0
	}
	d.b = d.b[k:]
	return v
}

func (d *decoder) varint(field string) int64 {
	if d.err != nil {
		return 0
	}
	v, k := binary.Varint(d.b)
	if k <= 0 || !shortest(d.b, k) {
		d.fail(field, errVarint)
		return 0
	}
	d.b = d.b[k:]
	return v
}

func (d *decoder) str(field string) string {
	n := d.uvarint(field)
	if d.err != nil {
		return ""
	}
	if n > uint64(len(d.b)) {
		d.fail(field, fmt.Errorf("%d bytes, %d left", n, len(d.b)))
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

func (d *decoder) f64(field string) float64 {
	if d.err != nil {
		return 0
	}
	if len(d.b) < 8 {
		d.fail(field, errors.New("truncated"))
		return 0
	}
	v := math.Float64frombits(binary.LittleEndian.Uint64(d.b))
	if math.IsNaN(v) || math.IsInf(v, 0) {
		d.fail(field, fmt.Errorf("%v: not finite", v))
		return 0
	}
	d.b = d.b[8:]
	return v
}

func (d *decoder) byte(field string) byte {
	if d.err != nil {
		return 0
	}
	if len(d.b) == 0 {
		d.fail(field, errors.New("truncated"))
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}
