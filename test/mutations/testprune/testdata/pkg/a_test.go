package pkg_test

import "testing"

func TestA(t *testing.T) { helper(t, newBox()) }
