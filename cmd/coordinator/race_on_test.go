//go:build race

package main

// raceEnabled shortens tests whose size the race detector makes slow.
const raceEnabled = true
