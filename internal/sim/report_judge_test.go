package sim

import "testing"

// The second judge on step counts, against cases worked by hand: B 2,
// r 1/s, steps of 100ms.
func TestFalseRefusalsAndShort(t *testing.T) {
	const step = 100_000
	all := func(int) bool { return true }
	for _, c := range []struct {
		name         string
		adm, dem     []int32
		false, short int64
	}{
		{"refused with the bucket full", []int32{0}, []int32{1}, 1, 1},
		{"refused once the burst is spent", []int32{2, 0}, []int32{2, 1}, 0, 0},
		{"room for one, three refused: one counts", []int32{1, 0}, []int32{1, 3}, 1, 1},
		{"refused a second after the burst", append([]int32{2}, make([]int32, 10)...), append([]int32{2}, append(make([]int32, 9), 1)...), 1, 1},
		{"admitted beyond an exact bucket: short negative", []int32{3}, []int32{3}, 0, -1},
	} {
		t.Run(c.name, func(t *testing.T) {
			f, _ := falseRefusals(c.adm, c.dem, step, 2, 1, all)
			var adm int64
			for _, a := range c.adm {
				adm += int64(a)
			}
			short := exactAdmits(c.dem, step, 2, 1) - adm
			if f != c.false || short != c.short {
				t.Fatalf("false refusals %d, short %d; want %d, %d", f, short, c.false, c.short)
			}
		})
	}
}
