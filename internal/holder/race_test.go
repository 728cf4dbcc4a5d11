//go:build race

package holder_test

func init() { raceEnabled = true }
