package grammar

import "slices"

// maxStacks bounds the stacks a Matcher follows at once. anyOf forks the
// stack, one per alternative; alternatives that accept the same bytes stay
// alive side by side until they diverge or merge. Past the bound the
// youngest stacks are dropped: every stack kept is alive, so the output
// still validates, and which are dropped depends only on the tokens.
const maxStacks = 64

// config is a set of stacks laid out one after another in frames; stack
// i ends at ends[i] (its top is frames[ends[i]-1]).
type config struct {
	frames []frame
	ends   []int32
}

func (c *config) reset() {
	c.frames = c.frames[:0]
	c.ends = c.ends[:0]
}

func (c *config) len() int { return len(c.ends) }

func (c *config) stack(i int) []frame {
	start := int32(0)
	if i > 0 {
		start = c.ends[i-1]
	}
	return c.frames[start:c.ends[i]]
}

func (c *config) push(s []frame) {
	c.frames = append(c.frames, s...)
	c.ends = append(c.ends, int32(len(c.frames)))
}

func (c *config) copyFrom(o *config) {
	c.frames = append(c.frames[:0], o.frames...)
	c.ends = append(c.ends[:0], o.ends...)
}

// dedupe removes stacks equal to an earlier one and keeps at most limit.
func (c *config) dedupe(limit int) {
	if len(c.ends) <= 1 {
		return
	}
	w := 0 // stacks kept
	wf := int32(0)
	for i := range c.ends {
		s := c.stack(i)
		dup := false
		for j := 0; j < w && !dup; j++ {
			start := int32(0)
			if j > 0 {
				start = c.ends[j-1]
			}
			dup = slices.Equal(c.frames[start:c.ends[j]], s)
		}
		if dup || w == limit {
			continue
		}
		n := int32(copy(c.frames[wf:], s))
		wf += n
		c.ends[w] = wf
		w++
	}
	c.frames = c.frames[:wf]
	c.ends = c.ends[:w]
}

// Outcomes of stepping one stack when the bottom of the stack may pop (a
// window of a deeper stack).
const (
	escNone     = iota
	escConsumed // the bottom frame completed on this byte
	escRefeed   // the bottom frame completed before this byte: its parent must take it
)

// initFrame is the frame of node id before its first byte.
func (g *Grammar) initFrame(id int32) frame {
	n := &g.nodes[id]
	f := frame{node: id}
	switch n.kind {
	case kArray:
		f.a, f.b = n.minItems, n.maxItems
	case kString:
		if n.pat == nil {
			f.a, f.b = n.minLen, n.maxLen
		}
	case kLiteral:
		f.a = n.lit
	case kRoot:
		if len(n.pre) > 0 {
			f.st = rPrefix
		}
	}
	return f
}

// stepStack appends to dst the stacks that s becomes after byte c (none
// when c is not allowed, several when c starts an anyOf) and reports
// whether the bottom of s completed (see escNone). scratch is reused.
func (g *Grammar) stepStack(s []frame, c byte, dst *config, scratch *[]frame) int {
	start := int32(len(dst.frames))
	dst.frames = append(dst.frames, s...)
	for {
		top := int32(len(dst.frames)) - 1
		if top < start {
			return escRefeed
		}
		act, child := g.step(&dst.frames[top], c)
		switch act {
		case actStay:
			dst.ends = append(dst.ends, int32(len(dst.frames)))
			return escNone
		case actPop:
			dst.frames = dst.frames[:top]
			if top == start {
				return escConsumed
			}
			dst.ends = append(dst.ends, int32(len(dst.frames)))
			return escNone
		case actPopRefeed:
			dst.frames = dst.frames[:top]
			continue
		case actPush:
			*scratch = append((*scratch)[:0], dst.frames[start:]...)
			dst.frames = dst.frames[:start]
			for _, a := range g.nodes[child].alts {
				altStart := len(dst.frames)
				dst.frames = append(dst.frames, *scratch...)
				dst.frames = append(dst.frames, g.initFrame(a))
				ct := len(dst.frames) - 1
				switch act, _ := g.step(&dst.frames[ct], c); act {
				case actStay:
					dst.ends = append(dst.ends, int32(len(dst.frames)))
				case actPop:
					dst.frames = dst.frames[:ct]
					dst.ends = append(dst.ends, int32(len(dst.frames)))
				default:
					// Dead; a value's first byte never pushes or refeeds.
					dst.frames = dst.frames[:altStart]
				}
			}
			return escNone
		default: // actDead
			dst.frames = dst.frames[:start]
			return escNone
		}
	}
}

// stepConfig steps every stack of src over c into dst and reports whether
// some stack's bottom completed on the byte (consumed) or before it
// (refeed).
func (g *Grammar) stepConfig(src *config, c byte, dst *config, scratch *[]frame, limit int) (consumed, refeed bool) {
	dst.reset()
	for i := range src.len() {
		switch g.stepStack(src.stack(i), c, dst, scratch) {
		case escConsumed:
			consumed = true
		case escRefeed:
			refeed = true
		}
	}
	dst.dedupe(limit)
	return consumed, refeed
}
