//go:build race

package grammar

// raceEnabled shortens the slowest property tests under the race
// detector, which runs them ten times slower.
const raceEnabled = true
