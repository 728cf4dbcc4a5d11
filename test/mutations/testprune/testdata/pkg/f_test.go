package pkg_test

// A blank var runs at init: kept whatever the tests.
var _ = registered()

func registered() int { return 1 }
