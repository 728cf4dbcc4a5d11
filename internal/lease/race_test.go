//go:build race

package lease

func init() { raceEnabled = true }
