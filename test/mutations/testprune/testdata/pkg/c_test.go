package pkg_test

type box struct{ n int }

// Not reached from TestA, but compiled with newBox: helper2 is kept.
func unusedInC() { helper2() }

func newBox() *box { return &box{} }
