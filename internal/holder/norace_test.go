package holder_test

// raceEnabled is set by race_test.go under -race.
var raceEnabled bool
