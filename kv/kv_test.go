package kv

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func newAlloc(t *testing.T, blocks, bs int, caching bool) *Allocator {
	t.Helper()
	a, err := New(Config{Blocks: blocks, BlockSize: bs, PrefixCaching: caching})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func check(t *testing.T, a *Allocator) {
	t.Helper()
	if err := a.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
}

func tableOf(a *Allocator, seq SeqID) []BlockID { return a.AppendTable(nil, seq, -1) }

func toks(n int, base int32) []int32 {
	s := make([]int32, n)
	for i := range s {
		s[i] = base + int32(i)
	}
	return s
}

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("DefaultConfig: %v", err)
	}
	for _, tc := range []struct {
		cfg   Config
		field string
	}{
		{Config{Blocks: 0, BlockSize: 16}, "Blocks"},
		{Config{Blocks: MaxBlocks + 1, BlockSize: 16}, "Blocks"},
		{Config{Blocks: 8, BlockSize: 0}, "BlockSize"},
		{Config{Blocks: 8, BlockSize: MaxBlockSize + 1}, "BlockSize"},
	} {
		err := tc.cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("Validate(%+v) = %v, want an error naming %s", tc.cfg, err, tc.field)
		}
		if _, err := New(tc.cfg); err == nil {
			t.Errorf("New(%+v) succeeded", tc.cfg)
		}
	}
}

func TestAllocateExtendEnd(t *testing.T) {
	a := newAlloc(t, 4, 4, false)
	if _, err := a.Allocate(1, nil, 5, 0); err != nil { // 2 blocks
		t.Fatal(err)
	}
	check(t, a)
	if got, want := tableOf(a, 1), []BlockID{0, 1}; !cmp.Equal(got, want) {
		t.Fatalf("table = %v, want %v", got, want)
	}
	if err := a.Extend(1, 8); err != nil { // still 2 blocks
		t.Fatal(err)
	}
	if err := a.Extend(1, 9); err != nil { // 3 blocks
		t.Fatal(err)
	}
	check(t, a)
	// All or nothing: 2 more blocks wanted, 1 available.
	if _, err := a.Allocate(2, nil, 5, 0); !errors.Is(err, ErrOutOfBlocks) {
		t.Fatalf("Allocate short = %v, want ErrOutOfBlocks", err)
	}
	if err := a.Extend(1, 17); !errors.Is(err, ErrOutOfBlocks) {
		t.Fatalf("Extend short = %v, want ErrOutOfBlocks", err)
	}
	check(t, a)
	if got, want := a.Stats(), (Stats{Total: 4, Used: 3, Free: 1, Sequences: 1}); got != want {
		t.Fatalf("stats after shortfalls = %+v, want %+v", got, want)
	}
	// Reserve: 1 block available, asking for 1 with 1 in reserve fails.
	if _, err := a.Allocate(2, nil, 1, 1); !errors.Is(err, ErrOutOfBlocks) {
		t.Fatalf("Allocate with reserve = %v, want ErrOutOfBlocks", err)
	}
	if _, err := a.Allocate(2, nil, 1, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Allocate(2, nil, 1, 0); !errors.Is(err, ErrSequenceExists) {
		t.Fatalf("second Allocate = %v, want ErrSequenceExists", err)
	}
	if err := a.Extend(9, 1); !errors.Is(err, ErrUnknownSequence) {
		t.Fatalf("Extend unknown = %v, want ErrUnknownSequence", err)
	}
	a.End(1)
	check(t, a)
	if got, want := a.Stats(), (Stats{Total: 4, Used: 1, Free: 3, Sequences: 1}); got != want {
		t.Fatalf("stats after End = %+v, want %+v", got, want)
	}
	a.End(2)
	check(t, a)
	if got := a.Stats(); got.Used != 0 || got.Free != 4 || got.Sequences != 0 {
		t.Fatalf("stats after draining = %+v", got)
	}
}

func TestTableHandle(t *testing.T) {
	a := newAlloc(t, 8, 4, false)
	if h := a.Table(3); h != nil {
		t.Fatalf("Table of unknown sequence = %+v, want nil", h)
	}
	if _, err := a.Allocate(3, nil, 5, 0); err != nil { // 2 blocks
		t.Fatal(err)
	}
	h := a.Table(3)
	if h == nil || h.Seq() != 3 || h.Len() != 2 {
		t.Fatalf("Table(3) = %+v, want sequence 3 with 2 blocks", h)
	}
	if err := a.Extend(3, 9); err != nil { // 3 blocks, seen through the handle
		t.Fatal(err)
	}
	if got, want := h.Len(), 3; got != want {
		t.Fatalf("handle Len after Extend = %d, want %d", got, want)
	}
	dst := []BlockID{99}
	if got, want := h.AppendBlocks(dst, 2), []BlockID{99, 0, 1}; !cmp.Equal(got, want) {
		t.Fatalf("AppendBlocks(2) = %v, want %v", got, want)
	}
	if got, want := h.AppendBlocks(nil, -1), tableOf(a, 3); !cmp.Equal(got, want) {
		t.Fatalf("AppendBlocks(-1) = %v, AppendTable %v", got, want)
	}
	panics := func(f func()) (msg string) {
		defer func() { msg = fmt.Sprint(recover()) }()
		f()
		return ""
	}
	if msg := panics(func() { h.AppendBlocks(nil, 4) }); !strings.Contains(msg, "sequence 3 has 3 blocks, 4 asked for") {
		t.Fatalf("AppendBlocks past the end panicked with %q", msg)
	}
	a.End(3)
	check(t, a)
	if msg := panics(func() { h.Len() }); !strings.Contains(msg, "ended sequence 3") {
		t.Fatalf("Len of an ended table panicked with %q", msg)
	}
	if msg := panics(func() { h.AppendBlocks(nil, 1) }); !strings.Contains(msg, "ended sequence 3") {
		t.Fatalf("AppendBlocks of an ended table panicked with %q", msg)
	}
}

func TestEndPanics(t *testing.T) {
	a := newAlloc(t, 4, 4, false)
	if _, err := a.Allocate(7, nil, 4, 0); err != nil {
		t.Fatal(err)
	}
	a.End(7)
	msg := func() (msg string) {
		defer func() { msg = fmt.Sprint(recover()) }()
		a.End(7)
		return ""
	}()
	if !strings.Contains(msg, "sequence 7") {
		t.Fatalf("double End panicked with %q, want the sequence named", msg)
	}
	// A corrupted refcount is reported with the block and the sequence.
	if _, err := a.Allocate(8, nil, 4, 0); err != nil {
		t.Fatal(err)
	}
	id := tableOf(a, 8)[0]
	a.ref[id] = 0
	msg = func() (msg string) {
		defer func() { msg = fmt.Sprint(recover()) }()
		a.End(8)
		return ""
	}()
	if want := fmt.Sprintf("block %d by sequence 8", id); !strings.Contains(msg, want) {
		t.Fatalf("End with a broken refcount panicked with %q, want %q in it", msg, want)
	}
}

func TestPrefixSharingAndLRU(t *testing.T) {
	a := newAlloc(t, 6, 4, true)
	prompt := toks(10, 100) // 2 full blocks + 2 tokens
	if c, err := a.Allocate(1, prompt[:9], 10, 0); err != nil || c != 0 {
		t.Fatalf("first Allocate = %d, %v", c, err)
	}
	// Nothing is shared before it is committed.
	if c, err := a.Allocate(2, prompt[:9], 10, 0); err != nil || c != 0 {
		t.Fatalf("Allocate before commit = %d, %v", c, err)
	}
	a.End(2)
	a.Commit(1, prompt[:6]) // one full block computed
	a.Commit(1, prompt[:9]) // and the second
	check(t, a)
	c, err := a.Allocate(3, prompt[:9], 10, 0)
	if err != nil || c != 8 {
		t.Fatalf("Allocate after commit = %d, %v, want 8 cached", c, err)
	}
	t1, t3 := tableOf(a, 1), tableOf(a, 3)
	if !cmp.Equal(t1[:2], t3[:2]) || t1[2] == t3[2] {
		t.Fatalf("tables %v and %v: want the first two blocks shared, the third not", t1, t3)
	}
	check(t, a)
	if st := a.Stats(); st.Used != 4 || st.Sequences != 2 || st.PrefixHit != 8 || st.PrefixQueried != 27 {
		t.Fatalf("stats = %+v", st)
	}
	// A different continuation shares only the first block.
	other := append(append([]int32{}, prompt[:4]...), 1, 2, 3, 4, 5)
	if c, err := a.Allocate(4, other, 9, 0); err != nil || c != 4 {
		t.Fatalf("Allocate of a diverging prompt = %d, %v, want 4", c, err)
	}
	a.End(4)
	a.End(1)
	check(t, a)
	// Block 0 and 1 are still held by sequence 3.
	if st := a.Stats(); st.Used != 3 || st.Cached != 0 {
		t.Fatalf("stats with one owner left = %+v", st)
	}
	a.End(3)
	check(t, a)
	if st := a.Stats(); st.Used != 0 || st.Cached != 2 || st.Free != 4 {
		t.Fatalf("stats after all ended = %+v, want 2 cached", st)
	}
	// Parked blocks are reused by a matching prefix…
	if c, err := a.Allocate(5, prompt[:9], 9, 0); err != nil || c != 8 {
		t.Fatalf("Allocate from the LRU = %d, %v", c, err)
	}
	check(t, a)
	a.End(5)
	// … and evicted when space is needed: 6 blocks asked, 4 free + 2 cached.
	if _, err := a.Allocate(6, nil, 24, 0); err != nil {
		t.Fatal(err)
	}
	check(t, a)
	if st := a.Stats(); st.Used != 6 || st.Cached != 0 || st.Free != 0 {
		t.Fatalf("stats after eviction = %+v", st)
	}
	a.End(6)
	if c, err := a.Allocate(7, prompt[:9], 9, 0); err != nil || c != 0 {
		t.Fatalf("Allocate after eviction = %d, %v, want a miss", c, err)
	}
	a.End(7)
	check(t, a)
}

// A match that needs LRU blocks counts them as no longer available.
func TestAllocateCountsMatchedLRUBlocks(t *testing.T) {
	a := newAlloc(t, 3, 2, true)
	p := []int32{1, 2, 3, 4}
	if _, err := a.Allocate(1, p, 4, 0); err != nil {
		t.Fatal(err)
	}
	a.Commit(1, p)
	a.End(1) // 2 cached, 1 free
	// Matches 2 cached blocks, needs 2 more: only 1 is left.
	if _, err := a.Allocate(2, p, 8, 0); !errors.Is(err, ErrOutOfBlocks) {
		t.Fatalf("Allocate = %v, want ErrOutOfBlocks", err)
	}
	check(t, a)
	if c, err := a.Allocate(2, p, 6, 0); err != nil || c != 4 {
		t.Fatalf("Allocate = %d, %v, want 4 cached", c, err)
	}
	check(t, a)
}

func TestHitRate(t *testing.T) {
	if got := (Stats{}).HitRate(); got != 0 {
		t.Fatalf("empty HitRate = %v", got)
	}
	if got := (Stats{PrefixQueried: 4, PrefixHit: 1}).HitRate(); got != 0.25 {
		t.Fatalf("HitRate = %v", got)
	}
}
