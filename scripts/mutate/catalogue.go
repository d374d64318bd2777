package main

// The catalogue: small, plausible bugs in the code that keeps a sequence's
// KV from outliving it (kv, sched, the shard's replica table, the runner's
// tombstone handling, the shard's control logic, the coordinator's
// backstop and reconcile). Each must fail a test of the packages named, or
// the rule it breaks is not proven (STYLE.md, section 7).
//
// A new safety rule comes with its mutation: add it here, with the
// package (and, where that keeps the run fast, the tests) that must catch
// it, and run `go run ./scripts/mutate -run NAME` to see it killed. Prefer a
// fast unit test as the catcher; a mutation only a slow multi-process test
// catches means a unit test is missing.
//
// Orig must occur exactly once in File; mutate refuses to run otherwise,
// so an edit of the code that moves a snippet fails CI instead of silently
// retiring the mutation: update the snippet with the code.

// Packages and test filters, shared by the entries below.
var (
	pkgKV    = []string{"./kv"}
	pkgSched = []string{"./sched"}
	pkgShard = []string{"./shard"}
	pkgCoord = []string{"./coordinator"}
)

const (
	// runSchedPolicy is the scheduler's batching-policy tests: the
	// scenario scripts and the tests of what a batch holds.
	runSchedPolicy = `^Test(Scenarios|DecodesBeforeRunningPrefill|DecodesFirst|ChunkedPrefill|FCFSAdmission)$`
	// runShard is the shard tests that need neither the shared model
	// files nor the network: the replica table, runners on a random-weight
	// model, and the node's control logic behind fakes.
	runShard = `^Test(Table|RunnerTombstonesBeforeRows$|RunnerRefusals$|Control|NodeLeaseExpiresMany$|Shard)`
	// runCoordBackstop is the coordinator's backstop and reconcile unit
	// tests, which need no network.
	runCoordBackstop = `^Test(Backstop|Remote)`
	// runCoordLoss is the coordinator's loss, placement and membership
	// tests that turn the cluster's loop by hand, and the engine's and
	// API's degraded-service tests over a fake pipeline: no shard, no
	// network but httptest's.
	// runCoordLedger is the engine-over-cluster tests: answers and
	// reconcile by the scheduler's record.
	runCoordLedger = `^TestEngine(Ledger|RunsTheClusterLoop|TurnFollows)$`
	runCoordLoss   = `^Test(Loss|MembershipIsAHint$|EngineFailsDispatched|WaitingForAPipeline|StreamKeepAlive$)`
)

// The control core's scenario scripts (control/testdata/scenarios): pure,
// a fraction of a second.
var pkgControl = []string{"./control"}

const runControlCore = `^TestScenarios$`

// The wire layer's checks and the coordinator's refusals (transport and
// its callers: a message is validated in one place and refused, counted,
// never used).
var pkgTransport = []string{"./transport"}

const (
	// runWire is transport's tests of its checks and of the recovering
	// interceptors: no network but bufconn.
	runWire = `^Test(BatchFromWire|ResultWire|FailedWire|CheckRegister|CheckControl|RecoverOptions)`
	// runCoordWire is the coordinator's tests of what it refuses: fake
	// shards on loopback, and the registry turned by hand.
	runCoordWire = `^Test(ClusterRefusesForgedAnswers|ClusterRegistryBounded|RegistryExpiry|ClusterErrorsDoNotEcho)$`
)

// runCoordTrust is the coordinator's test of Join and of identity binding:
// a secure cluster on loopback, no shard process.
const runCoordTrust = `^Test(SecureJoinAndBinding|InsecureClusterRefusesJoin)$`

// The scheduler's fill loops, whole: the batching policy mutation swaps
// them.
const (
	decodeLoop = "\tfor decodes && rows > 0 && tokens > 0 && s.decHead < len(s.decode) {\n" +
		"\t\tseq := s.decode[s.decHead]\n" +
		"\t\ts.decode[s.decHead] = nil\n" +
		"\t\ts.decHead++\n" +
		"\t\tif seq.dead || !s.grow(seq, seq.scheduled+1) {\n" +
		"\t\t\tcontinue\n" +
		"\t\t}\n" +
		"\t\tb.add(seq, seq.scheduled, 1, false, true)\n" +
		"\t\tb.decodes = true\n" +
		"\t\tseq.scheduled++\n" +
		"\t\trows--\n" +
		"\t\ttokens--\n" +
		"\t}\n"
	prefillLoop = "\tfor _, seq := range s.prefill {\n" +
		"\t\tif rows == 0 || tokens == 0 {\n" +
		"\t\t\tbreak\n" +
		"\t\t}\n" +
		"\t\tif seq.dead {\n" +
		"\t\t\tcontinue\n" +
		"\t\t}\n" +
		"\t\ttokens -= s.chunk(b, seq, tokens, false)\n" +
		"\t\trows--\n" +
		"\t}\n"
	prefillPrune = "\ts.prefill = slices.DeleteFunc(s.prefill, func(seq *sequence) bool {\n" +
		"\t\tif seq.dead || seq.scheduled == len(seq.req.tokens) {\n" +
		"\t\t\tseq.prefill = false\n" +
		"\t\t\treturn true\n" +
		"\t\t}\n" +
		"\t\treturn false\n" +
		"\t})\n"
	admitLoop = "\tfor rows > 0 && tokens > 0 && !s.blocked && s.waitHead != nil {\n" +
		"\t\tseq := s.admit(s.waitHead, tokens)\n" +
		"\t\tif seq == nil {\n" +
		"\t\t\ts.blocked = true\n" +
		"\t\t\tbreak\n" +
		"\t\t}\n" +
		"\t\ttokens -= s.chunk(b, seq, tokens, true)\n" +
		"\t\trows--\n" +
		"\t\tif seq.scheduled < len(seq.req.tokens) {\n" +
		"\t\t\tseq.prefill = true\n" +
		"\t\t\ts.prefill = append(s.prefill, seq)\n" +
		"\t\t}\n" +
		"\t}\n"
)

var catalogue = []mutation{
	// kv: the block allocator.
	{
		Name: "kv/free-forgotten", File: "kv/kv.go", Pkgs: pkgKV,
		Orig: "a.free = append(a.free, id)", Repl: "_ = a.free",
		Why: "End forgets a freed block: it never returns to the pool",
	},
	{
		Name: "kv/end-keeps-table", File: "kv/kv.go", Pkgs: pkgKV,
		Orig: "delete(a.tables, seq)", Repl: "_ = seq",
		Why: "End leaves the sequence's table behind: a double End is not caught, the count leaks",
	},
	{
		Name: "kv/shared-block-freed", File: "kv/kv.go", Pkgs: pkgKV,
		Orig: "a.ref[id]--\n\tif a.ref[id] > 0 {\n\t\treturn\n\t}", Repl: "a.ref[id]--",
		Why: "End frees a prefix block another live sequence still shares",
	},
	{
		Name: "kv/lru-double-count", File: "kv/kv.go", Pkgs: pkgKV,
		Orig: "if need*groups+reserve > a.Available()-fromLRU {", Repl: "if need*groups+reserve > a.Available() {",
		Why: "Allocate counts the cached blocks it is about to share as available too and over-commits",
	},
	{
		Name: "kv/reserve-ignored", File: "kv/kv.go", Pkgs: pkgKV,
		Orig: "if need*groups+reserve > a.Available()-fromLRU {", Repl: "if need*groups > a.Available()-fromLRU {",
		Why: "Allocate ignores the watermark reserve kept for running decodes",
	},
	{
		Name: "kv/extend-overcommit", File: "kv/kv.go", Pkgs: pkgKV,
		Orig: "if need*a.cfg.groups() > a.Available() {", Repl: "if need*a.cfg.groups() > a.Available()+1 {",
		Why: "Extend hands out one block more than the pool has",
	},
	{
		Name: "kv/take-uncounted", File: "kv/kv.go", Pkgs: pkgKV,
		Orig: "a.ref[id] = 1\n\ta.used++", Repl: "a.ref[id] = 1",
		Why: "a block handed out is not counted as used",
	},
	{
		Name: "kv/sequence-replaced", File: "kv/kv.go", Pkgs: pkgKV,
		Orig: `return 0, fmt.Errorf("%w: %d", ErrSequenceExists, seq)`, Repl: "_ = ErrSequenceExists",
		Why: "a second Allocate for a live sequence replaces its table, leaking the old blocks",
	},
	// kv: layer groups and Slide (docs/sliding-window-kv.md).
	{
		Name: "kv/slide-frees-window", File: "kv/kv.go", Pkgs: pkgKV,
		Orig: "to := min(lo/a.cfg.BlockSize, len(t.blocks))", Repl: "to := min(lo/a.cfg.BlockSize+1, len(t.blocks))",
		Why: "Slide also frees the block holding lo, which the row reading lo still needs",
	},
	{
		Name: "kv/slide-touches-global", File: "kv/kv.go", Pkgs: pkgKV,
		Orig: "for _, s := range t.sliding {\n\t\tfor i := t.first; i < to; i++ {",
		Repl: "for _, s := range append([][]BlockID{t.blocks}, t.sliding...) {\n\t\tfor i := t.first; i < to; i++ {",
		Why:  "Slide frees the global table's entries too, which global layers still read",
	},
	{
		Name: "kv/slide-first-lowered", File: "kv/kv.go", Pkgs: pkgKV,
		Orig: "if to <= t.first {\n\t\treturn nil\n\t}", Repl: "",
		Why: "a Slide with a lower lo than before moves the window back over released entries",
	},
	{
		Name: "kv/slide-first-stuck", File: "kv/kv.go", Pkgs: pkgKV,
		Orig: "\tt.first = to\n", Repl: "",
		Why: "Slide releases entries but leaves them inside the live range: End frees them again",
	},
	{
		Name: "kv/end-forgets-sliding", File: "kv/kv.go", Pkgs: pkgKV,
		Orig: "for i := len(s) - 1; i >= t.first; i-- {\n\t\t\ta.release(s[i], seq)\n\t\t}", Repl: "",
		Why: "End releases the global table only: the sliding tables' blocks leak",
	},
	{
		Name: "kv/end-releases-released", File: "kv/kv.go", Pkgs: pkgKV,
		Orig: "i >= t.first; i--", Repl: "i >= 0; i--",
		Why: "End releases sliding entries Slide already gave back, which another sequence may hold",
	},
	{
		Name: "kv/recycled-first-kept", File: "kv/kv.go", Pkgs: pkgKV,
		Orig: "\tt.first = 0\n", Repl: "",
		Why: "a recycled table keeps its old first entry: the next sequence's leading blocks are never read or freed",
	},
	{
		Name: "kv/allocate-one-group", File: "kv/kv.go", Pkgs: pkgKV,
		Orig: "if need*groups+reserve > a.Available()-fromLRU {", Repl: "if need+reserve > a.Available()-fromLRU {",
		Why: "Allocate checks capacity for the global table alone and runs dry filling the sliding ones",
	},
	{
		Name: "kv/extend-one-group", File: "kv/kv.go", Pkgs: pkgKV,
		Orig: "if need*a.cfg.groups() > a.Available() {", Repl: "if need > a.Available() {",
		Why: "Extend checks capacity for the global table alone and runs dry filling the sliding ones",
	},
	{
		Name: "kv/grow-global-only", File: "kv/kv.go", Pkgs: pkgKV,
		Orig: "for g := range t.sliding {\n\t\tfor range need {", Repl: "for g := range t.sliding[:0] {\n\t\tfor range need {",
		Why: "Allocate and Extend grow the global table only: sliding layers write through missing entries",
	},
	{
		Name: "kv/groups-without-window", File: "kv/kv.go", Pkgs: pkgKV,
		Orig: "if c.Groups > 1 && (c.Window < 1 || c.Window > MaxWindow) {", Repl: "if c.Groups > 1 && c.Window > MaxWindow {",
		Why: "Validate accepts sliding groups with no window: every prefix hit would need the whole prefix in every group",
	},
	{
		Name: "kv/sliding-hit-unchecked", File: "kv/kv.go", Pkgs: pkgKV,
		Orig: "for i := matched - 1; i >= a.windowStart(matched); i-- {", Repl: "for i := matched - 1; i >= matched; i-- {",
		Why: "a prefix hit shares sliding blocks it never found: released ones, overwritten by other sequences",
	},
	{
		Name: "kv/sliding-hit-window-late", File: "kv/kv.go", Pkgs: pkgKV,
		Orig: "return max(0, m*a.cfg.BlockSize-a.cfg.Window+1) / a.cfg.BlockSize", Repl: "return max(0, m*a.cfg.BlockSize-a.cfg.Window+1+a.cfg.BlockSize) / a.cfg.BlockSize",
		Why: "a hit's sliding tables start a block after the window its first row reads: that row reads a block it does not hold",
	},
	{
		Name: "kv/sliding-hit-first-zero", File: "kv/kv.go", Pkgs: pkgKV,
		Orig: "\t\tt.first = from\n", Repl: "\t\tt.first = 0\n",
		Why: "a hit's sliding tables claim the released entries before its window as live",
	},
	{
		Name: "kv/sliding-hit-lru-uncounted", File: "kv/kv.go", Pkgs: pkgKV,
		Orig: "for g := 1; g < groups && i >= from; g++ {", Repl: "for g := 1; g < 1 && i >= from; g++ {",
		Why: "Allocate counts the cached sliding blocks a hit takes as still available, and hands out blocks it does not have",
	},
	{
		Name: "kv/commit-no-sliding", File: "kv/kv.go", Pkgs: pkgKV,
		Orig: "for g, sl := range t.sliding {\n\t\t\tif i >= t.first {", Repl: "for g, sl := range t.sliding[:0] {\n\t\t\tif i >= t.first {",
		Why: "Commit indexes no sliding block: sliding models never hit the prefix cache (a chat re-prefills its history)",
	},
	{
		Name: "kv/lookup-any-group", File: "kv/kv.go", Pkgs: pkgKV,
		Orig: "if !ok || a.parent[id] != parent || int(a.group[id]) != g {", Repl: "if !ok || a.parent[id] != parent {",
		Why: "a lookup takes a block cached for other layers' K/V as long as key, parent and tokens agree",
	},
	{
		Name: "kv/invariant-group-unchecked", File: "kv/invariants.go", Pkgs: pkgKV,
		Orig: "if a.cfg.PrefixCaching && a.hashed[id] && int(a.group[id]) != g {", Repl: "if a.cfg.PrefixCaching && a.hashed[id] && int(a.group[id]) != g && false {",
		Why: "CheckInvariants misses a table naming a block cached as another group's",
	},
	{
		Name: "kv/commit-released-sliding", File: "kv/kv.go", Pkgs: pkgKV,
		Orig: "if i >= t.first {\n\t\t\t\ta.register(", Repl: "if i >= 0 {\n\t\t\t\ta.register(",
		Why: "Commit indexes released sliding entries: a block another sequence now holds, or no block at all",
	},

	// sched: the one function every ending goes through, and the policy.
	{
		Name: "sched/decodes-after-prefills", File: "sched/sched.go", Pkgs: pkgSched,
		Orig: decodeLoop + "\n" + prefillLoop, Repl: prefillLoop + "\n" + decodeLoop,
		Why: "running prefills take the token budget before decodes: streams stall behind long prompts",
	},
	{
		Name: "sched/admissions-before-prefills", File: "sched/sched.go", Pkgs: pkgSched, Run: runSchedPolicy,
		Orig: prefillLoop + prefillPrune + "\n" + admitLoop, Repl: admitLoop + "\n" + prefillLoop + prefillPrune,
		Why: "admissions take the budget before running prefills: a long prompt starves behind newcomers",
	},
	{
		Name: "sched/chunk-past-budget", File: "sched/sched.go", Pkgs: pkgSched, Run: runSchedPolicy,
		Orig: "n := min(len(seq.req.tokens)-seq.scheduled, budget)", Repl: "n := len(seq.req.tokens) - seq.scheduled",
		Why: "a prefill chunk is the rest of the prompt, not what the budget allows: one long prompt stalls every stream",
	},
	{
		Name: "sched/in-flight-one-more", File: "sched/sched.go", Pkgs: pkgSched, Run: runSchedPolicy,
		Orig: "len(s.inflight)+len(s.building) < s.maxInFlight", Repl: "len(s.inflight)+len(s.building) <= s.maxInFlight",
		Why: "one batch more than the in-flight limit is dispatched: it queues at a stage and adds latency to every stream",
	},
	{
		Name: "sched/in-flight-p", File: "sched/config.go", Pkgs: pkgSched, Run: runSchedPolicy,
		Orig: "return c.Stages + 1", Repl: "return c.Stages",
		Why: "P batches in flight instead of P+1: a stage idles while a result travels back",
	},
	{
		Name: "sched/decodes-in-every-batch", File: "sched/sched.go", Pkgs: pkgSched, Run: runSchedPolicy,
		Orig: "decodes := s.decodeBatches() < s.cfg.Stages", Repl: "decodes := true",
		Why: "decodes ride in the batch beyond P too: the running sequences split into P+1 groups that never merge, and every stage streams its weights P+1 times per generated token",
	},
	{
		Name: "sched/row-limit-ignored", File: "sched/sched.go", Pkgs: pkgSched, Run: runSchedPolicy,
		Orig: "\t\tif rows == 0 || tokens == 0 {\n\t\t\tbreak\n\t\t}\n", Repl: "\t\tif tokens == 0 {\n\t\t\tbreak\n\t\t}\n",
		Why: "a running prefill's chunk joins a batch already at MaxBatchRows",
	},
	{
		Name: "sched/end-keeps-blocks", File: "sched/sched.go", Pkgs: pkgSched,
		Orig: "s.kv.End(seq.id)", Repl: "_ = seq.id",
		Why: "an ending frees no blocks in the allocator",
	},
	{
		Name: "sched/end-no-tombstone", File: "sched/sched.go", Pkgs: pkgSched,
		Orig: "s.tombs = append(s.tombs, Tombstone{Seq: seq.id, Reason: tr})", Repl: "_ = tr",
		Why: "an ending emits no tombstone: the shards keep the sequence's KV",
	},
	{
		Name: "sched/end-not-dead", File: "sched/sched.go", Pkgs: pkgSched,
		Orig: "seq.dead = true", Repl: "seq.dead = false",
		Why: "an ended sequence is not marked dead: its queued rows are still dispatched",
	},
	{
		Name: "sched/abort-loses-to-finish", File: "sched/sched.go", Pkgs: pkgSched,
		Orig: "s.tombs[r.tomb].Reason = reason", Repl: "_ = reason",
		Why: "an abort in the step of a natural finish leaves the tombstone saying finished",
	},
	{
		Name: "sched/complete-dead-rows", File: "sched/sched.go", Pkgs: pkgSched,
		Orig: "if seq.dead {\n\t\t\tif got {", Repl: "if seq.dead && false {\n\t\t\tif got {",
		Why: "a result for a dead sequence's row is appended to its request",
	},
	{
		Name: "sched/preempt-oldest", File: "sched/sched.go", Pkgs: pkgSched,
		Orig: "victim := s.runTail", Repl: "victim := s.runHead",
		Why: "preemption evicts the oldest running sequence instead of the youngest",
	},
	{
		Name: "sched/emit-dead-rows", File: "sched/sched.go", Pkgs: pkgSched,
		Orig: "func(row recRow) bool { return row.seq.dead }", Repl: "func(row recRow) bool { return false }",
		Why: "rows of a sequence preempted while its batch was built are dispatched against freed blocks",
	},
	{
		Name: "sched/lost-batch-kept", File: "sched/sched.go", Pkgs: pkgSched,
		Orig: "s.end(row.seq.req, lost)", Repl: "_ = row",
		Why: "a lost batch's sequences are never tombstoned",
	},
	{
		Name: "sched/deadline-never", File: "sched/sched.go", Pkgs: pkgSched,
		Orig: "if now.Before(r.due()) {", Repl: "if true {",
		Why: "deadlines are never judged: a timed-out request keeps its blocks",
	},
	{
		Name: "sched/reclaim-never", File: "sched/sched.go", Pkgs: pkgSched,
		Orig: "if now.Before(b.sent.Add(s.cfg.ReclaimTimeout)) {", Repl: "if true {",
		Why: "a batch whose result never comes is never reclaimed, pinning its sequences",
	},
	{
		Name: "sched/reset-keeps-running", File: "sched/sched.go", Pkgs: pkgSched,
		Orig: "\tfor s.runHead != nil {\n\t\ts.end(s.runHead.req, Preempted)\n\t}\n", Repl: "",
		Why: "a new pipeline keeps the old pipeline's sequences, with no tombstone",
	},
	{
		Name: "sched/seq-id-reused", File: "sched/sched.go", Pkgs: pkgSched,
		Orig: "\ts.nextSeq++\n", Repl: "",
		Why: "an admission reuses a sequence ID instead of a fresh one",
	},
	{
		Name: "sched/slide-skipped", File: "sched/sched.go", Pkgs: pkgSched,
		Orig: "if err := s.kv.Slide(seq.id, max(0, row.pos-s.cfg.KV.Window+1)); err != nil {",
		Repl: "if err := error(nil); err != nil {",
		Why:  "sliding tables are never released: a long Gemma sequence holds every layer's KV",
	},
	{
		Name: "sched/slide-past-window", File: "sched/sched.go", Pkgs: pkgSched,
		Orig: "max(0, row.pos-s.cfg.KV.Window+1)", Repl: "max(0, row.pos+1)",
		Why: "a row releases the sliding blocks it reads: another sequence overwrites its window",
	},
	{
		Name: "sched/admit-whole-prompt-grouped", File: "sched/sched.go", Pkgs: pkgSched,
		Orig: "positions = min(positions, budget)", Repl: "positions = max(positions, budget)",
		Why: "a long prompt takes Groups times its blocks at admission, and a recomputed sequence may never fit again",
	},
	{
		Name: "sched/admit-ignores-peak", File: "sched/sched.go", Pkgs: pkgSched,
		Orig: "if s.kv.Available() < s.peakBlocks(positions)+reserve {", Repl: "if false {",
		Why: "a recomputed long sequence is let in on its first chunk's blocks and preempts itself at the next, over and over",
	},
	{
		Name: "sched/peak-ignores-sliding", File: "sched/sched.go", Pkgs: pkgSched,
		Orig: "return b + (s.cfg.KV.Groups-1)*min(b, slide)", Repl: "return b + 0*slide",
		Why: "admission and the never-fits bound count the global table only: sequences are let in that the sliding tables cannot hold",
	},
	{
		Name: "sched/chunk-no-grow", File: "sched/sched.go", Pkgs: pkgSched,
		Orig: "\tif !s.grow(seq, seq.scheduled+n) {\n\t\treturn 0\n\t}\n", Repl: "",
		Why: "a prefill chunk past the admitted blocks writes through table entries that do not exist",
	},
	{
		Name: "sched/never-fits-ignores-groups", File: "sched/sched.go", Pkgs: pkgSched,
		Orig: "\tif s.cfg.KV.Groups <= 1 {\n\t\treturn blocks * bs\n\t}\n", Repl: "\treturn blocks * bs\n",
		Why: "a request whose sliding tables can never fit beside its global one is queued, and wedges the queue",
	},

	// shard/table.go: the replica table.
	{
		Name: "table/create-at-hwm", File: "shard/table.go", Pkgs: pkgShard, Run: runShard,
		Orig: "dead || seq <= t.hwm", Repl: "dead || seq < t.hwm",
		Why: "a create at the high-water mark (a duplicate or late first row) resurrects the sequence",
	},
	{
		Name: "table/early-tombstone-forgotten", File: "shard/table.go", Pkgs: pkgShard, Run: runShard,
		Orig: "t.early[seq] = r", Repl: "_ = r",
		Why: "a tombstone that overtakes its sequence's create is forgotten; the create succeeds",
	},
	{
		Name: "table/epoch-keeps-hwm", File: "shard/table.go", Pkgs: pkgShard, Run: runShard,
		Orig: "t.epoch, t.hwm = e, 0", Repl: "t.epoch = e",
		Why: "a new epoch keeps the old high-water mark and refuses its own first sequences",
	},
	{
		Name: "table/epoch-keeps-early", File: "shard/table.go", Pkgs: pkgShard, Run: runShard,
		Orig: "\tclear(t.early)\n", Repl: "",
		Why: "a new epoch keeps the old epoch's early tombstones and refuses creates of those IDs",
	},
	{
		Name: "table/epoch-frees-nothing", File: "shard/table.go", Pkgs: pkgShard, Run: runShard,
		Orig: "for seq := range t.live {\n\t\tt.free(seq, Epoch)\n\t}", Repl: "",
		Why: "a newer epoch frees none of the older sequences",
	},
	{
		Name: "table/older-epoch-accepted", File: "shard/table.go", Pkgs: pkgShard, Run: runShard,
		Orig: "case e < t.epoch:\n\t\treturn false", Repl: "case e < t.epoch:\n\t\treturn true",
		Why: "work of an older epoch is accepted",
	},
	{
		Name: "table/too-few-blocks", File: "shard/table.go", Pkgs: pkgShard, Run: runShard,
		Orig: "need := (pos + n + bs - 1) / bs", Repl: "need := (pos + n) / bs",
		Why: "a row naming too few blocks for its positions is accepted",
	},
	{
		Name: "table/block-at-pool-size", File: "shard/table.go", Pkgs: pkgShard, Run: runShard,
		Orig: "if b < 0 || int(b) >= t.pool {\n\t\t\treturn refuse(", Repl: "if b < 0 || int(b) > t.pool {\n\t\t\treturn refuse(",
		Why: "a block ID equal to the pool size (one past the end) is accepted",
	},
	{
		Name: "table/negative-block", File: "shard/table.go", Pkgs: pkgShard, Run: runShard,
		Orig: "if b < 0 || int(b) >= t.pool {\n\t\t\treturn refuse(", Repl: "if int(b) >= t.pool {\n\t\t\treturn refuse(",
		Why: "a negative block ID is accepted",
	},
	{
		Name: "table/replayed-position", File: "shard/table.go", Pkgs: pkgShard, Run: runShard,
		Orig: "if pos != r.length {", Repl: "if pos > r.length {",
		Why: "a replayed row at an old position is accepted and overwrites KV",
	},
	{
		Name: "table/blocks-rewritten", File: "shard/table.go", Pkgs: pkgShard, Run: runShard,
		Orig: "if !slices.Equal(blocks[:min(len(r.blocks), need)], r.blocks[:min(len(r.blocks), need)]) {", Repl: "if false {",
		Why: "a row may rewrite a live sequence's block table",
	},
	{
		Name: "table/renew-nothing", File: "shard/table.go", Pkgs: pkgShard, Run: runShard,
		Orig: "for _, r := range t.live {\n\t\tr.renew = now\n\t}", Repl: "",
		Why: "heartbeat replies renew no lease: healthy sequences lapse",
	},
	{
		Name: "table/lease-frees-one", File: "shard/table.go", Pkgs: pkgShard, Run: runShard,
		Orig: "t.free(seq, Lease)\n\t\t\tn++", Repl: "t.free(seq, Lease)\n\t\t\tn++\n\t\t\treturn n",
		Why: "a lease check frees only the first lapsed sequence",
	},
	{
		Name: "table/reconcile-frees-nothing", File: "shard/table.go", Pkgs: pkgShard, Run: runShard,
		Orig: "t.free(seq, Reconcile)", Repl: "_ = seq",
		Why: "sequences the coordinator no longer knows are kept",
	},

	// shard/runner.go: tombstones in a batch and out of band.
	{
		Name: "runner/tombstones-after-rows", File: "shard/runner.go", Pkgs: pkgShard, Run: runShard,
		Orig: "\tfor _, t := range b.Tombstones {\n\t\tr.tombstoneLocked(t)\n\t}\n",
		Repl: "\tdefer func() {\n\t\tfor _, t := range b.Tombstones {\n\t\t\tr.tombstoneLocked(t)\n\t\t}\n\t}()\n",
		Why:  "a batch's tombstones are applied after its rows: a late row of the ended sequence is computed",
	},
	{
		Name: "runner/exit-keeps-sampler", File: "shard/runner.go", Pkgs: pkgShard, Run: runShard,
		Orig: "\tdelete(r.states, seq)\n", Repl: "",
		Why: "an ended sequence's sampler state (params, token history, logprob wish, grammar matcher) stays on the last stage",
	},
	{
		Name: "table/free-skips-exit", File: "shard/table.go", Pkgs: pkgShard, Run: runShard,
		Orig: "\tif t.onEnd != nil {\n\t\tt.onEnd(seq, r)\n\t}\n", Repl: "",
		Why: "a sequence freed by the table (lease, epoch, reconcile, tombstone) keeps the runner's state beside it",
	},
	{
		Name: "runner/close-keeps-sequences", File: "shard/runner.go", Pkgs: pkgShard, Run: runShard,
		Orig: "r.table.EndAll(Epoch)", Repl: "_ = Epoch",
		Why: "a placement that ends keeps its sequences' state and counts none of them freed",
	},
	{
		Name: "runner/late-sample-of-ended", File: "shard/runner.go", Pkgs: pkgShard, Run: runShard,
		Orig: "if !r.table.Has(row.Seq) { // ended during the forward pass", Repl: "if false { // ended during the forward pass",
		Why: "a sequence ended while its batch computed is sampled and gets a fresh sampler state after its end",
	},
	{
		Name: "shard/compute-under-node-lock", File: "shard/node_stage.go", Pkgs: pkgShard, Run: runShard,
		Orig: "\tn.mu.Lock()\n\tp := n.p\n\tn.mu.Unlock()\n", Repl: "\tn.mu.Lock()\n\tdefer n.mu.Unlock()\n\tp := n.p\n",
		Why: "a batch computes under Node.mu: heartbeats, lease renewal and /metrics wait behind the forward pass",
	},
	{
		Name: "runner/bad-token-keeps-sequence", File: "shard/runner.go", Pkgs: pkgShard, Run: runShard,
		Orig: "r.table.Tombstone(row.Seq, Failed)\n\t\t\t\t\terr = &RowError{Seq: row.Seq, Code: transport.CodeBadToken", Repl: "_ = row.Seq\n\t\t\t\t\terr = &RowError{Seq: row.Seq, Code: transport.CodeBadToken",
		Why: "a row with a token outside the vocabulary is dropped but its sequence keeps its blocks",
	},
	{
		Name: "runner/stale-epoch-accepted", File: "shard/runner.go", Pkgs: pkgShard, Run: runShard,
		Orig: "case b.Epoch < cur:\n\t\treturn nil, fmt.Errorf(\"%w: batch %d\", ErrStaleEpoch, b.ID)", Repl: "case b.Epoch < cur:\n\t\t_ = ErrStaleEpoch",
		Why: "a batch of an older epoch is computed",
	},
	{
		Name: "runner/future-epoch-adopted", File: "shard/runner.go", Pkgs: pkgShard, Run: runShard,
		Orig: "case b.Epoch > cur:\n\t\treturn nil, fmt.Errorf(\"%w: batch %d\", ErrFutureEpoch, b.ID)", Repl: "case b.Epoch > cur:\n\t\tr.table.SetEpoch(b.Epoch)",
		Why: "a batch of a newer epoch is adopted (only the coordinator's control stream may move the epoch): one forged batch fails every later request",
	},
	{
		Name: "table/negative-position", File: "shard/table.go", Pkgs: pkgShard, Run: runShard,
		Orig: "if pos < 0 || n <= 0 || bs <= 0 {", Repl: "if n <= 0 || bs <= 0 {",
		Why: "a row at a negative position reaches the block arithmetic (a panic that took a shard down)",
	},
	{
		Name: "table/early-tombstones-unbounded", File: "shard/table.go", Pkgs: pkgShard, Run: runShard,
		Orig: "if (t.hwm > 0 && seq-t.hwm > MaxEarlyTombstones) || len(t.early) >= MaxEarlyTombstones {", Repl: "if false {",
		Why: "tombstones for far-future sequences are kept without bound (600k of them: +300 MB and slower creates)",
	},
	{
		Name: "table/early-window-ignored", File: "shard/table.go", Pkgs: pkgShard, Run: runShard,
		Orig: "(t.hwm > 0 && seq-t.hwm > MaxEarlyTombstones) || len(t.early)", Repl: "len(t.early)",
		Why: "once sequences exist, a tombstone far above the high-water mark still takes a place a legitimate one needs",
	},
	{
		Name: "table/first-create-keeps-far", File: "shard/table.go", Pkgs: pkgShard, Run: runShard,
		Orig: "if s-seq > MaxEarlyTombstones {", Repl: "if false {",
		Why: "the far-future tombstones kept before the first create stay forever, holding the limit full",
	},

	// shard control: heartbeat replies, the backstop, the lease clock.
	{
		Name: "control/reconcile-ignored", File: "shard/node_control.go", Pkgs: pkgShard, Run: runShard,
		Orig: "n.p.runner.Renew(r.GetUnknownSeqs(), time.Now())", Repl: "n.p.runner.Renew(nil, time.Now())",
		Why: "the shard ignores the heartbeat reply's list of sequences the coordinator no longer knows",
	},
	{
		Name: "control/backstop-acked-unapplied", File: "shard/node_control.go", Pkgs: pkgShard, Run: runShard,
		Orig: "n.applyTombstones(ts.GetTombstones())", Repl: "_ = ts.GetTombstones()",
		Why: "backstop tombstones are acked but never applied",
	},
	{
		Name: "control/backstop-newer-epoch", File: "shard/node_control.go", Pkgs: pkgShard, Run: runShard,
		Orig: "case e > cur:\n\t\t\tr.SetEpoch(e)", Repl: "case e > cur:",
		Why: "a backstop tombstone of a newer epoch does not first drop the older epoch's sequences",
	},
	{
		Name: "control/backstop-older-epoch", File: "shard/node_control.go", Pkgs: pkgShard, Run: runShard,
		Orig: "case e != 0 && e < cur:\n\t\t\tcontinue", Repl: "case e != 0 && e < cur:",
		Why: "a backstop tombstone of an older epoch frees the newer epoch's sequence of the same ID",
	},
	{
		Name: "control/newer-epoch-reply", File: "shard/node_control.go", Pkgs: pkgShard, Run: runShard,
		Orig: "if r.GetEpoch() > epoch {\n\t\t\tn.setEpoch(r.GetEpoch())", Repl: "if r.GetEpoch() > epoch {",
		Why: "a newer epoch on the control stream does not drop the older sequences at once",
	},
	{
		Name: "control/reply-lease-ignored", File: "shard/node_control.go", Pkgs: pkgShard, Run: runShard,
		Orig: "if r.GetLeaseMs() > 0 {\n\t\t\tn.lease.Store(", Repl: "if false && r.GetLeaseMs() > 0 {\n\t\t\tn.lease.Store(",
		Why: "the lease a heartbeat reply announces is ignored",
	},
	{
		Name: "control/lease-clock-stopped", File: "shard/node.go", Pkgs: pkgShard, Run: runShard,
		Orig: "freed = n.p.runner.Expire(time.Now(), lease)", Repl: "freed = n.p.runner.Expire(time.Now(), 1<<62)",
		Why: "the lease loop never frees a lapsed sequence",
	},

	// coordinator: the acked backstop and anti-entropy.
	{
		Name: "coord/reconnect-no-resend", File: "coordinator/cluster.go", Pkgs: pkgCoord, Run: runCoordBackstop,
		Orig: "for _, t := range s.unacked {\n\t\tout.push(", Repl: "for _, t := range s.unacked[:0] {\n\t\tout.push(",
		Why: "a reconnected control stream does not get the unacked tombstones again",
	},
	{
		Name: "coord/backstop-not-kept", File: "coordinator/cluster.go", Pkgs: pkgCoord, Run: runCoordBackstop,
		Orig: "s.unacked = append(s.unacked, msg)", Repl: "_ = msg",
		Why: "backstop tombstones are not kept until acked",
	},
	{
		Name: "coord/ack-forgets-others", File: "coordinator/cluster.go", Pkgs: pkgCoord, Run: runCoordBackstop,
		Orig: "return t.GetAckId() == id", Repl: "return t.GetAckId() != id",
		Why: "an ack forgets every other unacked message instead of its own",
	},
	{
		Name: "coord/backstop-skips-disconnected", File: "coordinator/cluster.go", Pkgs: pkgCoord, Run: runCoordBackstop,
		Orig: "if s == nil {\n\t\t\tcontinue\n\t\t}\n\t\ts.nextAck++", Repl: "if s == nil || !s.connected() {\n\t\t\tcontinue\n\t\t}\n\t\ts.nextAck++",
		Why: "a shard whose control stream is down gets no backstop, so nothing is resent on reconnect",
	},
	{
		Name: "coord/progress-tokens-rows", File: "sched/sched.go", Pkgs: []string{"./sched"}, Run: "^TestInFlightBatch$",
		Orig: "n += row.n", Repl: "n += min(row.n, 1)",
		Why: "the tokens in flight count rows, not tokens: a long prefill chunk gets a decode's share of the progress deadline",
	},
	{
		Name: "coord/dispatched-not-live", File: "coordinator/engine.go", Pkgs: pkgCoord, Run: runCoordLedger,
		Orig: "for _, s := range l.e.s.RunningSeqs(nil) {", Repl: "for _, s := range l.e.s.RunningSeqs(nil)[:0] {",
		Why: "dispatched sequences are not known live: reconcile would free them on the shards",
	},
	{
		Name: "coord/tombstoned-not-ending", File: "coordinator/remote.go", Pkgs: pkgCoord, Run: runCoordBackstop,
		Orig: "p.ended[t.Seq] = struct{}{}", Repl: "_ = t",
		Why: "a sequence just tombstoned is named unknown at once: reconcile races its tombstone, and frees what the tombstone would have",
	},
	{
		Name: "coord/rotation-no-grace", File: "coordinator/remote.go", Pkgs: pkgCoord, Run: runCoordBackstop,
		Orig: "p.endedOld, p.ended = p.ended, p.endedOld\n\tclear(p.ended)", Repl: "clear(p.ended)",
		Why: "a rotation forgets sequences tombstoned just before it: reconcile races their tombstones",
	},
	{
		Name: "coord/ended-never-forgotten", File: "coordinator/remote.go", Pkgs: pkgCoord, Run: runCoordBackstop,
		Orig: "p.endedOld, p.ended = p.ended, p.endedOld\n\tclear(p.ended)", Repl: "p.endedOld, p.ended = p.ended, p.endedOld",
		Why: "tombstoned IDs are never forgotten: a shard that missed the tombstone is never reconciled",
	},
	{
		Name: "coord/backstop-not-queued", File: "coordinator/remote.go", Pkgs: pkgCoord, Run: runCoordBackstop,
		Orig: "p.backstop = append(p.backstop, b.Tombstones...)", Repl: "",
		Why: "dispatched tombstones never reach the control-stream backstop",
	},
	{
		Name: "coord/pending-dropped", File: "coordinator/remote.go", Pkgs: pkgCoord, Run: runCoordBackstop,
		Orig: "p.pending = b.Tombstones\n", Repl: "p.pending = nil\n",
		Why: "in-band tombstones dispatched while no pipeline is ready are lost",
	},
	{
		Name: "coord/link-full-drops-tombstones", File: "coordinator/remote.go", Pkgs: pkgCoord, Run: runCoordBackstop,
		Orig: "p.pending = append(b.Tombstones, p.pending...)", Repl: "_ = p.pending",
		Why: "tombstones of a batch the full stage-0 link refused are lost",
	},
	// control: placement by measured speed.
	{
		Name: "placement/speed-ignores-memory", File: "control/placement.go", Pkgs: []string{"./control"}, Run: `^TestPlanFor`,
		Orig: "if free < int64(minBlocks)*int64(shape.KVSlots(a, b))*shape.KVBytesPerBlockLayer {", Repl: "if false {",
		Why: "placement by speed gives a fast shard more layers than its memory holds beside half the memory-only KV pool",
	},
	{
		Name: "placement/kv-slots-per-layer", File: "control/placement.go", Pkgs: []string{"./control"}, Run: `^TestPlanKVGroups`,
		Orig: "\tif s.KVGroup == nil {\n\t\treturn end - first\n\t}\n", Repl: "\treturn end - first\n",
		Why: "placement sizes a grouped model's pool by its layers, not its largest group's: a sliding model gets a fraction of the blocks it fits",
	},
	{
		Name: "placement/speed-head-free", File: "control/placement.go", Pkgs: []string{"./control"}, Run: `^TestPlanFor`,
		Orig: "t += rates[i].head * float64(shape.HeadBytes)", Repl: "_ = rates[i].head",
		Why: "placement by speed counts the head as no work: the last stage is overloaded",
	},
	// control core: losses, placement after them, and membership as a hint
	// (control/core.go, killed by its scenario scripts).
	{
		Name: "core/gossip-outweighs-stream", File: "control/core.go", Pkgs: pkgControl, Run: runControlCore,
		Orig: "if s.connected && c.answering(s, now) {", Repl: "if false {",
		Why: "a gossip death or leave (forgeable) of a shard whose control stream is alive and answering is taken as its loss",
	},
	{
		Name: "core/min-shards-after-formation", File: "control/core.go", Pkgs: pkgControl, Run: runControlCore,
		Orig: "if c.active == nil && len(cands) < c.cfg.MinShards {", Repl: "if len(cands) < c.cfg.MinShards {",
		Why: "--min-shards gates every re-placement: after a loss the streams stay silent though the survivors can hold the model",
	},
	{
		Name: "core/stream-break-not-a-loss", File: "control/core.go", Pkgs: pkgControl, Run: runControlCore,
		Orig: `c.lose(s, fmt.Sprintf("control stream closed: %v", err), now)`, Repl: "_ = s",
		Why: "a placed shard whose control stream broke stays placed: nothing re-places, the streams wait for a confirmation",
	},
	{
		Name: "core/lost-sticks-on-rejoin", File: "control/core.go", Pkgs: pkgControl, Run: runControlCore,
		Orig: "s.lost = false // it is evidently alive", Repl: "_ = s.lost // it is evidently alive",
		Why: "a lost shard whose control stream came back stays lost while the stream lives",
	},
	{
		Name: "core/reincarnation-not-a-loss", File: "control/core.go", Pkgs: pkgControl, Run: runControlCore,
		Orig: "if why != \"\" {\n\t\tc.lose(s, why, now)", Repl: "if false {\n\t\tc.lose(s, why, now)",
		Why: "a new incarnation of a placed node replaces the old process without a loss: the pipeline keeps dispatching to a shard that is gone",
	},
	{
		Name: "core/heartbeat-not-life", File: "control/core.go", Pkgs: pkgControl, Run: runControlCore,
		Orig: "s.alive = later(s.alive, now)\n\t}\n\treturn nil", Repl: "_ = later(s.alive, now)\n\t}\n\treturn nil",
		Why: "heartbeats do not count as a stream's life: a gossip death outweighs a shard that answers, LossConfirm after its stream opened",
	},
	{
		Name: "core/healed-keeps-cannot-place", File: "control/core.go", Pkgs: pkgControl, Run: runControlCore,
		Orig: "c.cannotPlace = false\n\tif c.dispatching", Repl: "if c.dispatching",
		Why: "a placement made whole again keeps saying nothing can hold the model: its next pause fails every dispatched request",
	},
	{
		Name: "core/switch-before-ready", File: "control/core.go", Pkgs: pkgControl, Run: runControlCore,
		Orig: "!s.connected || s.lost || s.staged != p.Version {", Repl: "!s.connected || s.lost {",
		Why: "a make-before-break re-placement switches before every stage of the new placement loaded: the pipeline breaks while a shard still loads",
	},
	{
		Name: "core/abandon-ignored", File: "control/core.go", Pkgs: pkgControl, Run: runControlCore,
		Orig: "\tc.abandon(fmt.Sprintf(\"shard %s failed to load: %s\", id, why))", Repl: "\t_ = why",
		Why: "a make-before-break placement one of whose shards failed to load stays pending: no re-plan for this placement ever again, and the shards hold what they loaded",
	},
	{
		Name: "core/staging-ignores-memory", File: "control/core.go", Pkgs: pkgControl, Run: runControlCore,
		Orig: "if need > s.Memory {", Repl: "if false {",
		Why: "a make-before-break placement is staged on a shard that cannot hold its served range and its new one at once: its load fails at best, at worst the process is killed and the serving pipeline with it",
	},
	{
		Name: "core/progress-deadline-fixed", File: "control/core.go", Pkgs: pkgControl, Run: runControlCore,
		Orig: "return max(progressFloor, progressFactor*step+prefillFactor*prefill)", Repl: "return progressUnknown",
		Why: "the progress deadline is a constant: a slow pipeline is declared stuck while it computes, a fast one hangs for long",
	},
	{
		Name: "core/progress-ignores-measured", File: "control/core.go", Pkgs: pkgControl, Run: runControlCore,
		Orig: "t = max(t, s.measured)", Repl: "_ = s.measured",
		Why: "a stage measured slower than predicted keeps the prediction's deadline: declared stuck while it computes",
	},
	{
		Name: "core/progress-no-tokens", File: "control/core.go", Pkgs: pkgControl, Run: runControlCore,
		Orig: "progressFactor*step+prefillFactor*prefill)", Repl: "progressFactor*step)",
		Why: "the progress deadline ignores the prompt tokens in flight: a long chunk of a large model on a CPU is failed before it can finish, on every attempt until the backoff catches up",
	},
	{
		Name: "core/progress-tokens-unscaled", File: "control/core.go", Pkgs: pkgControl, Run: runControlCore,
		Orig: "t *= float64(took) / float64(pred)", Repl: "_ = took",
		Why: "a stage measured slower than its calibration is assumed to prefill at the calibrated speed",
	},
	{
		Name: "core/progress-no-backoff", File: "control/core.go", Pkgs: pkgControl, Run: runControlCore,
		Orig: "c.misses++", Repl: "_ = c.misses",
		Why: "a passed deadline does not lengthen the next: a prefill chunk slower than the decode-scaled deadline fails on every retry and its request ends in a 500",
	},
	{
		Name: "core/progress-backoff-kept", File: "control/core.go", Pkgs: pkgControl, Run: runControlCore,
		Orig: "c.misses = 0", Repl: "_ = c.misses",
		Why: "an answer does not restore the deadline: after one slow batch a pipeline that is really stuck waits up to 8× as long before it is failed",
	},
	{
		Name: "core/progress-floor-low", File: "control/core.go", Pkgs: pkgControl, Run: runControlCore,
		Orig: "progressFloor   = 30 * time.Second", Repl: "progressFloor   = 5 * time.Second",
		Why: "a fast pipeline is declared stuck after 5 s: a shard paused for seconds, or one long prefill chunk, fails batches that were only slow and recomputes them, possibly forever",
	},
	{
		Name: "sched/inflight-row-index", File: "sched/sched.go", Pkgs: pkgSched, Run: `^TestInFlightRow$`,
		Orig: "return row.seq.req.id, row.pos + row.n - row.seq.req.prompt, true", Repl: "return row.seq.req.id, row.pos - row.seq.req.prompt, true",
		Why: "a sample's logprobs are attached to the wrong output token (the engine asks the scheduler where each sampled token goes)",
	},
	{
		Name: "shard/break-before-make", File: "shard/node_control.go", Pkgs: pkgShard, Run: `^TestNodeMakeBeforeBreak$`,
		Orig: "serving := n.p != nil", Repl: "serving := false",
		Why: "a shard swaps in a placement as soon as it loads: the pipeline still serving on the old one breaks before the switch",
	},
	{
		Name: "engine/turn-not-followed", File: "coordinator/engine.go", Pkgs: pkgCoord, Run: `^TestEngine(TurnFollows|RunsTheClusterLoop)$`,
		Orig: "\tcl.turn(ev)\n\te.followPending()", Repl: "\tcl.turn(ev)",
		Why: "the engine steps after a turn of the cluster's loop without following it: the step right after a pause dispatches into the paused pipeline, failing batches and costing requests retries though nothing was lost",
	},
	{
		Name: "engine/pause-keeps-in-flight", File: "coordinator/engine.go", Pkgs: pkgCoord, Run: runCoordLedger,
		Orig: "e.s.FailInFlight(e.lost)", Repl: "_ = e.lost",
		Why: "a pause never fails the scheduler's batches in flight: their requests wait for the 30 s reclaim deadline before they run again",
	},
	{
		Name: "coord/answer-clock-stays", File: "coordinator/remote.go", Pkgs: pkgCoord, Run: runCoordBackstop,
		Orig: "\tif n == 0 {\n\t\tp.busySince = time.Time{}\n\t} else {\n\t\tp.busySince = time.Now()\n\t}", Repl: "\t_ = n",
		Why: "an answer does not move the progress clock: a pipeline that answers steadily is declared stuck once the deadline passes from its first batch",
	},
	{
		Name: "engine/no-fit-keeps-dispatched", File: "coordinator/engine.go", Pkgs: pkgCoord, Run: runCoordLoss,
		Orig: "case errors.Is(err, ErrNoFit):\n\t\te.failAll(", Repl: "case false:\n\t\te.failAll(",
		Why: "when nothing left can hold the model, the requests in flight wait silently instead of ending with a 503",
	},
	{
		Name: "coord/reply-names-nothing", File: "coordinator/cluster.go", Pkgs: pkgCoord, Run: runCoordBackstop,
		Orig: "UnknownSeqs: c.pipe.unknown(hb.GetLiveSeqs(), c.ledger),", Repl: "UnknownSeqs: nil,",
		Why: "heartbeat replies never name the sequences the coordinator no longer knows",
	},

	// transport: every field of a batch checked before use.
	{
		Name: "wire/future-epoch-accepted", File: "transport/wire.go", Pkgs: pkgTransport, Run: runWire,
		Orig: "case h.GetEpoch() > lim.Epoch:\n\t\treturn nil, refuse(CodeFutureEpoch", Repl: "case false:\n\t\treturn nil, refuse(CodeFutureEpoch",
		Why: "a batch of an epoch the control stream has not announced passes the wire's check",
	},
	{
		Name: "wire/negative-position", File: "transport/wire.go", Pkgs: pkgTransport, Run: runWire,
		Orig: "case pos < 0 || pos > context-n:", Repl: "case pos > context-n:",
		Why: "a row at a negative position passes the wire's check",
	},
	{
		Name: "wire/position-past-context", File: "transport/wire.go", Pkgs: pkgTransport, Run: runWire,
		Orig: "case pos < 0 || pos > context-n:", Repl: "case pos < 0:",
		Why: "a row past the model's context passes the wire's check",
	},
	{
		Name: "wire/token-outside-vocab", File: "transport/wire.go", Pkgs: pkgTransport, Run: runWire,
		Orig: "if tok < 0 || int(tok) >= lim.Vocab {", Repl: "if tok < 0 {",
		Why: "a token ID past the vocabulary reaches the embedding and the sampler's history",
	},
	{
		Name: "wire/block-outside-pool", File: "transport/wire.go", Pkgs: pkgTransport, Run: runWire,
		Orig: "if blk < 0 || int(blk) >= lim.Blocks {", Repl: "if blk < 0 {",
		Why: "a block ID past the pool passes the wire's check",
	},
	{
		Name: "wire/free-text-reason", File: "transport/wire.go", Pkgs: pkgTransport, Run: runWire,
		Orig: "c, ok := ParseCode(f.GetReason())\n\tif !ok {", Repl: "c, ok := ParseCode(f.GetReason())\n\tif c = max(c, CodeBackendError); false && !ok {",
		Why: "a BatchFailed with a reason outside the enum is taken (and counted under some reason)",
	},
	{
		Name: "wire/no-logprob-drops-alternatives", File: "transport/wire.go", Pkgs: pkgTransport, Run: `^TestNoLogprobCrossesTheWire$`,
		Orig: "out.NoLogprob = !p.GetLogprobs() && out.TopLogprobs == 0", Repl: "out.NoLogprob = !p.GetLogprobs()",
		Why: "a request asking only for top_logprobs gets a sampler that skips the logprob sum (NaN logprob beside its alternatives)",
	},
	{
		Name: "wire/handler-panic-escapes", File: "transport/recover.go", Pkgs: pkgTransport, Run: runWire,
		Orig: "if v := recover(); v != nil {\n\t\t\t\t\terr = caught(info.FullMethod, v)", Repl: "if v := recover(); v != nil {\n\t\t\t\t\tpanic(v)",
		Why: "a stream handler's panic is not recovered: one bad message takes the process (and a coordinator running the shard) down",
	},

	// Sliding tables (docs/sliding-window-kv.md): what the wire lets through
	// and what a shard's replica table keeps of them.
	{
		Name: "wire/slide-from-past-window", File: "transport/wire.go", Pkgs: pkgTransport, Run: runWire,
		Orig: "if from < 0 || from > lo/bs {", Repl: "if from < 0 {",
		Why: "a row whose sliding tables released a block its window still reads passes the wire's check",
	},
	{
		Name: "wire/slide-negative-from", File: "transport/wire.go", Pkgs: pkgTransport, Run: runWire,
		Orig: "if from < 0 || from > lo/bs {", Repl: "if from > lo/bs {",
		Why: "a negative slide_from passes the wire's check",
	},
	{
		Name: "wire/slide-window-ignored", File: "transport/wire.go", Pkgs: pkgTransport, Run: runWire,
		Orig: "lo = max(0, int(r.GetPos())-lim.Window+1)", Repl: "lo = int(r.GetPos())",
		Why: "the window is not counted back from the row's position: every block before it may be released",
	},
	{
		Name: "wire/slide-window-off-by-one", File: "transport/wire.go", Pkgs: pkgTransport, Run: runWire,
		Orig: "lo = max(0, int(r.GetPos())-lim.Window+1)", Repl: "lo = max(0, int(r.GetPos())-lim.Window+2)",
		Why: "the window's first position is off by one: the block holding it may be released",
	},
	{
		Name: "wire/slides-without-groups", File: "transport/wire.go", Pkgs: pkgTransport, Run: runWire,
		Orig: "if from != 0 || len(slides) > 0 {", Repl: "if false {",
		Why: "sliding tables reach a stage whose model has none",
	},
	{
		Name: "wire/slide-groups-unchecked", File: "transport/wire.go", Pkgs: pkgTransport, Run: runWire,
		Orig: "len(slides) != (lim.Groups-1)*w {", Repl: "len(slides)%max(w, 1) != 0 {",
		Why: "a row with too few or too many sliding tables passes the wire's check as long as their widths agree",
	},
	{
		Name: "wire/slide-outside-pool", File: "transport/wire.go", Pkgs: pkgTransport, Run: runWire,
		Orig: "if sb < 0 || int(sb) >= lim.Blocks {", Repl: "if sb < 0 {",
		Why: "a sliding block ID past the pool passes the wire's check",
	},
	{
		Name: "table/slide-from-lowered", File: "shard/table.go", Pkgs: pkgShard, Run: runShard,
		Orig: "case slideFrom < r.from:", Repl: "case false:",
		Why: "a row brings back a sliding entry its sequence released, which another sequence may own now",
	},
	{
		Name: "table/slides-rewritten", File: "shard/table.go", Pkgs: pkgShard, Run: runShard,
		Orig: "if !slices.Equal(slides[g*w+lo-slideFrom:g*w+have-slideFrom], live[lo-r.from:have-r.from]) {",
		Repl: "if false && !slices.Equal(slides[g*w+lo-slideFrom:g*w+have-slideFrom], live[lo-r.from:have-r.from]) {",
		Why:  "a row may rewrite a live sequence's sliding table",
	},
	{
		Name: "table/slide-groups-changed", File: "shard/table.go", Pkgs: pkgShard, Run: runShard,
		Orig: "case groups != len(r.slides):", Repl: "case false:",
		Why: "a row with another number of sliding tables than its sequence's is placed",
	},
	{
		Name: "table/slide-past-first-position", File: "shard/table.go", Pkgs: pkgShard, Run: runShard,
		Orig: "if slideFrom < 0 || slideFrom > pos/bs ||", Repl: "if slideFrom < 0 ||",
		Why: "a row whose sliding tables released the block of its own first position is placed",
	},
	{
		Name: "table/slide-negative-from", File: "shard/table.go", Pkgs: pkgShard, Run: runShard,
		Orig: "if slideFrom < 0 || slideFrom > pos/bs ||", Repl: "if slideFrom > pos/bs ||",
		Why: "a create with a negative slide_from is placed",
	},
	{
		Name: "table/slide-outside-pool", File: "shard/table.go", Pkgs: pkgShard, Run: runShard,
		Orig: "if sb < 0 || int(sb) >= t.pool {", Repl: "if sb < 0 {",
		Why: "a sliding block ID past the pool is placed",
	},
	{
		Name: "table/slides-keep-released", File: "shard/table.go", Pkgs: pkgShard, Run: runShard,
		Orig: "live = live[:copy(live, live[d:])]", Repl: "_ = d",
		Why: "the replica keeps the sliding entries a row released: its tables drift from the coordinator's and later rows are checked against the wrong entries",
	},
	{
		Name: "table/blocks-used-global-only", File: "shard/table.go", Pkgs: pkgShard, Run: runShard,
		Orig: "for _, live := range r.slides {\n\t\t\tfor _, b := range live {", Repl: "for _, live := range r.slides[:0] {\n\t\t\tfor _, b := range live {",
		Why: "the shard's block count leaves out the sliding tables: a leak of theirs escapes the drain check",
	},
	{
		Name: "runner/place-without-slides", File: "shard/runner.go", Pkgs: pkgShard, Run: runShard,
		Orig: "row.Blocks, row.SlideFrom, row.Slides, r.bs, now)", Repl: "row.Blocks, 0, nil, r.bs, now)",
		Why: "the runner places rows without their sliding tables: the replica checks none of them",
	},

	// coordinator: answers only from where a batch went, a bounded registry,
	// errors that keep its secrets.
	{
		Name: "coord/failure-from-anyone", File: "coordinator/remote.go", Pkgs: pkgCoord, Run: runCoordWire,
		Orig: "case !src.admits(fl, f.Shard):", Repl: "case false:",
		Why: "a BatchFailed sprayed on a stream that does not carry the batch fails it (every in-flight request)",
	},
	{
		Name: "coord/failure-names-any-row", File: "coordinator/remote.go", Pkgs: pkgCoord, Run: runCoordWire,
		Orig: "if _, ok := fl.rows[s]; !ok {", Repl: "if false {",
		Why: "a BatchFailed naming sequences the batch does not have is noted against it",
	},
	{
		Name: "coord/result-from-anyone", File: "coordinator/remote.go", Pkgs: pkgCoord, Run: runCoordWire,
		Orig: "case !src.admits(fl, \"\"):", Repl: "case false:",
		Why: "a result from a shard that is not the batch's last stage answers the batch",
	},
	{
		Name: "coord/registry-unbounded", File: "coordinator/cluster.go", Pkgs: pkgCoord, Run: runCoordWire,
		Orig: "if s == nil && len(c.shards) >= maxShards {", Repl: "if false {",
		Why: "junk Register calls grow the registry, the store and /v1/cluster without bound",
	},
	{
		Name: "coord/registry-never-expires", File: "coordinator/registry.go", Pkgs: pkgCoord, Run: runCoordWire,
		Orig: "delete(c.shards, id)\n\t\tif err := c.store.DeleteShard", Repl: "if err := c.store.DeleteShard",
		Why: "shards that are gone (or never opened a stream) keep their place in the registry forever",
	},
	{
		Name: "coord/error-echoes-epoch", File: "coordinator/cluster_grpc.go", Pkgs: pkgCoord, Run: runCoordWire,
		Orig: `status.Error(codes.FailedPrecondition, "coordinator: a stream of another epoch: register again")`,
		Repl: `status.Errorf(codes.FailedPrecondition, "coordinator: epoch %d: register again", c.start.Epoch)`,
		Why:  "an unauthenticated caller learns the epoch from an error",
	},
	// Trust: who may join, and what a certificate lets its holder claim.
	{
		Name: "trust/join-any-secret", File: "coordinator/join.go", Pkgs: pkgCoord, Run: runCoordTrust,
		Orig: "if err := c.auth.Tokens.Check(req.GetSecret(), now); err != nil {", Repl: "if err := error(nil); err != nil {",
		Why: "Join issues a certificate without a live token's secret: anyone who reaches the port joins",
	},
	{
		Name: "trust/peer-id-unchecked", File: "coordinator/join.go", Pkgs: pkgCoord, Run: runCoordTrust,
		Orig: "if role != trust.RoleShard || id != nodeID ||", Repl: "if false && role != trust.RoleShard || id != nodeID && false ||",
		Why: "a shard registers and opens streams as another node ID than its certificate's",
	},
	{
		Name: "trust/shard-id-unbound", File: "coordinator/join.go", Pkgs: pkgCoord, Run: runCoordTrust,
		Orig: `(shardID != "" && shardID != fmt.Sprintf("%s-%016x", id, incarnation))`, Repl: "false",
		Why: "a shard opens a control or results stream under another node's shard ID",
	},
	{
		Name: "trust/cert-not-required", File: "transport/grpc.go", Pkgs: pkgCoord, Run: runCoordTrust,
		Orig: "if slices.Contains(open, method) {", Repl: "if slices.Contains(open, method) || true {",
		Why: "calls without a cluster certificate reach the coordinator's handlers (weights, streams)",
	},
	{
		Name: "trust/ca-not-pinned", File: "transport/trust/trust.go", Pkgs: []string{"./transport/trust"}, Run: "^TestTLSPinningAndRoles$",
		Orig: "if Fingerprint(c.Raw) == fingerprint {", Repl: "if true {",
		Why: "a joining shard trusts any coordinator, whatever CA the token names, and hands it the secret",
	},
	{
		Name: "trust/gossip-unkeyed", File: "transport/membership/membership.go", Pkgs: []string{"./transport/membership"}, Run: "^TestSecretKeyAndLabel$",
		Orig: "mc.SecretKey = slices.Clone(cfg.SecretKey)", Repl: "_ = slices.Clone(cfg.SecretKey)",
		Why: "gossip goes unencrypted: a member without the key joins the cluster",
	},
	{
		Name: "constrain/mask-skipped", File: "shard/runner.go", Pkgs: pkgShard, Run: "^TestConstrainedDecoding$",
		Orig: "\t\t\tst.con.apply(logits)\n", Repl: "",
		Why: "a constrained sequence samples from unmasked logits: its output leaves the schema",
	},
	{
		Name: "constrain/carried-output-ignored", File: "shard/constrain.go", Pkgs: pkgShard, Run: "^TestConstrainedDecoding$",
		Orig: "if err := c.read(c.start, p.Output); err != nil {", Repl: "if err := c.read(c.start, nil); err != nil {",
		Why: "a recomputed constrained sequence whose prefix came from the cache masks as if its earlier output were not there",
	},
	{
		Name: "constrain/budget-off-by-one", File: "shard/constrain.go", Pkgs: pkgShard, Run: "^TestConstrainedDecodingCloses$",
		Orig: "return ok && d <= left-1", Repl: "return ok && d <= left",
		Why: "a drawn token stands when closing the document after it needs every token left: max_tokens cuts the document one byte short",
	},
	{
		Name: "engine/output-end-unset", File: "coordinator/engine.go", Pkgs: []string{"./cmd/coordinator"}, Run: "^TestHTTPStructuredOutputs$",
		Orig: "p.Sample.OutputEnd = len(p.Prompt) + p.MaxTokens", Repl: "_ = len(p.Prompt) + p.MaxTokens",
		Why: "max_tokens never reaches the last stage: a constrained document that runs into it ends cut and does not parse",
	},
	{
		Name: "grammar/close-forgets-brace", File: "model/grammar/close.go", Pkgs: []string{"./model/grammar"}, Run: "^TestBudgetedWalkValidates$",
		Orig: "end[np] = 1", Repl: "end[np] = 0",
		Why: "the distance to a whole document forgets an object's closing brace: a budgeted document ends unclosed",
	},
	{
		Name: "wire/constraint-output-unbounded", File: "transport/wire.go", Pkgs: []string{"./transport"}, Run: "^TestBatchFromWireRefusals$",
		Orig: "len(p.Output) > max(0, pos-p.OutputStart)", Repl: "false",
		Why: "a first row may carry more output than precedes it: the last stage's automaton reads tokens that are not the sequence's",
	},
	{
		Name: "api/schema-not-compiled", File: "coordinator/api_structured.go", Pkgs: pkgCoord, Run: "^TestBadInput$",
		Orig: "g, err := grammar.Compile(buf.Bytes())", Repl: "g, err := grammar.JSONObject(), error(nil)",
		Why: "an unsupported schema is queued instead of answered 400 naming its part; the last stage then drops the sequence",
	},
	{
		Name: "trust/upstream-node-unchecked", File: "shard/node_trust.go", Pkgs: pkgShard, Run: "^TestUpstreamCheck$",
		Orig: `!s.coordinator && p.assign.GetUpstreamNodeId() != "" && s.id != p.assign.GetUpstreamNodeId())`, Repl: "false)",
		Why: "any member's certificate feeds a stage past the first: a shard gone bad injects hidden states into another's stage",
	},
	{
		Name: "trust/upstream-role-unchecked", File: "shard/node_trust.go", Pkgs: pkgShard, Run: "^TestUpstreamCheck$",
		Orig: "(s.coordinator != (p.assign.GetStage() == 0) ||", Repl: "(false ||",
		Why: "a shard's certificate feeds stage 0, whose only upstream is the coordinator",
	},
	{
		Name: "calibrate/first-burst", File: "shard/calibrate.go", Pkgs: pkgShard, Run: "^TestCalibrationSeesACPUQuota$",
		Orig: "for n == 0 || now().Sub(start) < window {", Repl: "for n == 0 {",
		Why: "calibration times one short burst: a shard under a CPU quota reports full speed and is given more layers than it can serve",
	},
}
