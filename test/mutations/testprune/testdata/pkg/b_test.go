package pkg_test

import "testing"

func helper(t *testing.T, b *box) { t.Helper(); b.check(t) }
