package model

import "testing"

// TestKVGroups cuts real layouts: Gemma 3 27B's (62 layers, every sixth
// global: 10 global, 52 sliding in 6 groups of 10, the last of 2), Gemma 2's
// (every other layer), and models with one group.
func TestKVGroups(t *testing.T) {
	layout := func(n int, slides func(l int) bool) Config {
		c := Config{Layers: n, SlidingWindow: 1024, SlidingLayers: make([]bool, n)}
		for l := range n {
			c.SlidingLayers[l] = slides(l)
		}
		return c
	}
	gemma3 := layout(62, func(l int) bool { return l%6 != 5 })
	g := gemma3.KVGroups()
	if g.Groups != 7 {
		t.Fatalf("gemma3 27B: %d groups, want 7", g.Groups)
	}
	if g.Group(5) != 0 || g.Group(0) != 1 || g.Group(11) != 0 || g.Group(12) != 2 || g.Group(61) != 6 {
		t.Errorf("gemma3 27B groups of layers 5, 0, 11, 12, 61: %d %d %d %d %d", g.Group(5), g.Group(0), g.Group(11), g.Group(12), g.Group(61))
	}
	if s := g.Slots(0, 62); s != 10 {
		t.Errorf("gemma3 27B one stage: %d slots, want 10", s)
	}
	// Layers 0-11: sliding 0-4 and 6-10 (group 1: ten layers), global 5, 11.
	if s := g.Slots(0, 12); s != 10 {
		t.Errorf("gemma3 27B layers [0, 12): %d slots, want 10", s)
	}
	if s := g.Slots(3, 8); s != 4 { // sliding 3, 4, 6, 7 in group 1; global 5
		t.Errorf("gemma3 27B layers [3, 8): %d slots, want 4", s)
	}
	if g.Slot(3, 3) != 0 || g.Slot(3, 6) != 2 || g.Slot(3, 5) != 0 || g.Slot(0, 11) != 1 {
		t.Errorf("slots: %d %d %d %d", g.Slot(3, 3), g.Slot(3, 6), g.Slot(3, 5), g.Slot(0, 11))
	}
	gemma2 := layout(42, func(l int) bool { return l%2 == 0 }).KVGroups()
	if gemma2.Groups != 2 || gemma2.Slots(0, 42) != 21 {
		t.Errorf("gemma2 9B: %d groups, %d slots, want 2 and 21", gemma2.Groups, gemma2.Slots(0, 42))
	}
	for name, c := range map[string]Config{
		"no sliding layer": {Layers: 4},
		"all sliding":      layout(4, func(int) bool { return true }),
		"none sliding":     layout(4, func(int) bool { return false }),
	} {
		g := c.KVGroups()
		if g.Groups != 1 || g.Slots(0, 4) != 4 || g.Slot(0, 3) != 3 || g.Group(2) != 0 {
			t.Errorf("%s: %d groups, %d slots: want one group of every layer", name, g.Groups, g.Slots(0, 4))
		}
	}
}
