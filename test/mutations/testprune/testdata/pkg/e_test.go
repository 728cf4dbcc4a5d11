package pkg_test

import "testing"

// Reached by nothing TestA needs: pruned.
func TestE(t *testing.T) { unused() }

func unused() {}
