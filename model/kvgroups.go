package model

// KVGroups is how a model's layers share the KV pool when some of them
// slide (docs/sliding-window-kv.md). A block ID names 16 positions of one
// group's layers, not of every layer: group 0 holds the global layers,
// which read every position of a sequence, and the sliding layers are cut,
// in order, into groups of as many layers as group 0 has, each with a
// block table of its own whose blocks before the window can be released.
// Every group's layers sit at the same slots of a block ID, so a stage
// sizes a block ID for its largest group (Slots) and a short sequence
// costs what it costs with one table, padding aside (the last sliding
// group may be short).
//
// A model without sliding layers, or with no global one, has one group:
// every layer in table 0, today's layout.
type KVGroups struct {
	Groups int   // block tables per sequence: group 0 and the sliding groups
	group  []int // per layer
}

// KVGroups returns the model's layer groups.
func (c Config) KVGroups() KVGroups {
	g := KVGroups{Groups: 1, group: make([]int, c.Layers)}
	global := 0
	for l := range c.Layers {
		if c.Window(l) == 0 {
			global++
		}
	}
	if global == 0 || global == c.Layers {
		return g
	}
	sliding := 0
	for l := range c.Layers {
		if c.Window(l) > 0 {
			g.group[l] = 1 + sliding/global
			sliding++
		}
	}
	g.Groups = 1 + (sliding+global-1)/global
	return g
}

// Group is layer l's group: 0 for the global layers.
func (g KVGroups) Group(l int) int { return g.group[l] }

// Slot is layer l's slot in the KV pool of a stage starting at layer
// first: how many of the stage's layers before l share its group.
func (g KVGroups) Slot(first, l int) int {
	n := 0
	for i := first; i < l; i++ {
		if g.group[i] == g.group[l] {
			n++
		}
	}
	return n
}

// Slots is the layer slots a block ID needs on a stage of layers [first,
// end): the most of them in any one group.
func (g KVGroups) Slots(first, end int) int {
	count := make([]int, g.Groups)
	most := 0
	for l := first; l < end; l++ {
		count[g.group[l]]++
		most = max(most, count[g.group[l]])
	}
	return most
}
