package pkg_test

import "testing"

// A method of a type TestA reaches, declared apart: kept.
func (b *box) check(t *testing.T) { _ = b.n }
