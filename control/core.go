package control

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"time"
)

// Config configures a Core.
type Config struct {
	// Shape is the served model's, for placement.
	Shape Shape
	// MinShards holds the first placement until this many shards are
	// candidates (--min-shards). It gates nothing after that: a loss
	// re-places at once onto the shards left, however few.
	MinShards int
	// KVMemory caps each shard's KV pool in bytes (--kv-memory); 0 means
	// what each shard offers.
	KVMemory int64
	// Mix is the load placement balances the stages for; empty means
	// MixBalanced.
	Mix Mix
	// LossConfirm is how long stage 0 may stay without a stage stream
	// while its control stream is up before it is lost, how long the
	// shards of a restored placement are waited for, and how recent a
	// shard's last sign of life must be for its control stream to
	// outweigh a gossip death or leave.
	LossConfirm time.Duration
	// Epoch is this coordinator start's; placements are stamped with it.
	Epoch uint64
	// Restored is the placement persisted by the previous start, nil for
	// none: it is made again, under a new version, when every one of its
	// nodes is back within LossConfirm of Start.
	Restored *Placement
	// Start is when this coordinator started (the not-ready clock and the
	// restore wait begin there).
	Start time.Time
}

// Validate names the first field that is wrong.
func (c Config) Validate() error {
	switch {
	case c.MinShards < 1:
		return fmt.Errorf("control: Config.MinShards must be >= 1, got %d", c.MinShards)
	case c.KVMemory < 0:
		return fmt.Errorf("control: Config.KVMemory must be >= 0, got %d", c.KVMemory)
	case c.LossConfirm <= 0:
		return fmt.Errorf("control: Config.LossConfirm must be > 0, got %v", c.LossConfirm)
	}
	return c.Shape.Validate()
}

// ShardInfo is what a shard's registration tells the core.
type ShardInfo struct {
	// ID is the shard's ID (node ID and incarnation), unique per process.
	ID          string
	NodeID      string
	Incarnation uint64
	// Addr is its stage endpoint.
	Addr string
	// Memory is the bytes it may use for weights and KV; KVMemory caps its
	// KV pool (0: what fits after weights).
	Memory   int64
	KVMemory int64
	// Speed is its calibration on the served model; nil: none.
	Speed *Speed
	// Registered orders the candidates: placement takes them oldest
	// first.
	Registered time.Time
}

// MemberKind is what gossip says happened to a member.
type MemberKind uint8

// Member event kinds. Only MemberDead and MemberLeft can make a loss, and
// only of a shard whose control stream is down or silent.
const (
	MemberAlive MemberKind = iota + 1
	MemberSuspect
	MemberDead
	MemberLeft
)

// String returns "alive", "suspect", "dead" or "leave" (the word the
// coordinator's reasons have always used).
func (k MemberKind) String() string {
	switch k {
	case MemberAlive:
		return "alive"
	case MemberSuspect:
		return "suspect"
	case MemberDead:
		return "dead"
	case MemberLeft:
		return "leave"
	}
	return fmt.Sprintf("member(%d)", uint8(k))
}

// ActionKind says what an Action asks the shell to do.
type ActionKind uint8

// The actions, in the order the shell must carry out a slice of them.
const (
	// ActPause: stop dispatching, fail every in-flight batch, close the
	// stage-0 link and any link being opened. Reason says why.
	ActPause ActionKind = iota + 1
	// ActActivate: persist Placement and switch the pipeline to it
	// (paused until a link opens). ActAssign and ActSpare follow.
	ActActivate
	// ActAssign: send Shard its stage (Stage) of Placement.
	ActAssign
	// ActSpare: send Shard a spare Assign of Placement's version: it
	// drops the range it held, and its KV.
	ActSpare
	// ActOpenLink: every stage is READY: open the stage-0 link of
	// Placement to Shard (answer with LinkUp or LinkDown).
	ActOpenLink
	// ActResume: the link opened: dispatch on it.
	ActResume
	// ActLost: Shard is declared lost, for Reason.
	ActLost
	// ActCut: close Shard's control stream (declared gone while silent:
	// should it be alive after all, its return is a rejoin).
	ActCut
	// ActOverruled: gossip reported Shard gone while its control stream
	// is alive and answering; ignored (Reason says what gossip said).
	ActOverruled
	// ActLoaded: Shard reported READY for Placement.
	ActLoaded
	// ActLoadFailed: Shard failed to load its range (Reason).
	ActLoadFailed
	// ActReplan: a placement over the candidates now would be markedly
	// faster than the active one (Placement is that plan; Reason gives the
	// predicted stage times). It is made make-before-break: ActAssigns of
	// it follow, which shards load in the background while the active
	// placement serves on; once every stage reported READY for it, it is
	// activated (ActPause, ActActivate, spares, then the link): a switch
	// at a batch boundary, the old version's sequences dropped and
	// recomputed.
	ActReplan
	// ActAbandon: the placement being loaded make-before-break
	// (Placement) will not be switched to (Reason); the active one serves
	// on. ActAssign and ActSpare of the active placement follow for the
	// shards that were loading it, so that they drop what they loaded.
	ActAbandon
	// ActWarn: something an operator should know that changes nothing
	// now (Reason): a markedly faster placement was not staged because a
	// shard of it cannot hold its served range and its new one at once.
	ActWarn
)

var actionNames = [...]string{ActPause: "pause", ActActivate: "activate", ActAssign: "assign", ActSpare: "spare",
	ActOpenLink: "open-link", ActResume: "resume", ActLost: "lost", ActCut: "cut", ActOverruled: "overruled",
	ActLoaded: "loaded", ActLoadFailed: "load-failed", ActReplan: "replan", ActAbandon: "abandon", ActWarn: "warn"}

func (k ActionKind) String() string {
	if int(k) < len(actionNames) && actionNames[k] != "" {
		return actionNames[k]
	}
	return fmt.Sprintf("action(%d)", uint8(k))
}

// Action is one thing for the shell to do. Placement, when set, is the
// core's and never changed after it is returned: the shell may keep it.
type Action struct {
	Kind      ActionKind
	Shard     string
	Stage     int
	Placement *Placement
	Reason    string
}

// ShardState is the core's view of one shard (Core.Shard).
type ShardState struct {
	ShardInfo
	Connected bool
	// Lost: declared lost; excluded from placement until its control
	// stream opens again (or it registers again).
	Lost bool
	// Failed is its load failure of the last Assign ("" for none).
	Failed string
	// Ready is the placement version it reported READY for.
	Ready uint64
	// Staged is the make-before-break placement's version it reported
	// READY for (0: none).
	Staged uint64
}

// shard is the core's record of one registered shard.
type shard struct {
	ShardInfo
	connected bool
	lost      bool
	failed    string
	ready     uint64
	staged    uint64 // the next placement's version it reported READY for
	// alive is its control stream's latest sign of life: its opening or
	// a heartbeat.
	alive time.Time
	// measured is its mean time per batch, as its heartbeats last
	// reported (StageTime); 0: none yet.
	measured time.Duration
	// assigned: it held a range in some placement (a placement without it
	// sends it a spare Assign).
	assigned bool
}

// replanGain is how much faster (slowest stage, predicted) a placement
// over the candidates must be than the active one for ActReplan: "a
// markedly faster" shard, not noise in two calibrations.
const replanGain = 1.3

// Core is the control plane's decisions: which shards are alive, which are
// lost, where the layers go, and when the pipeline may dispatch. It is
// driven by one goroutine (the coordinator's loop): events in, actions out.
// Call Tick after every event and periodically (it confirms what waits on
// the clock, places, and opens the link).
type Core struct {
	cfg    Config
	shards map[string]*shard
	active *Placement
	// next is the placement being loaded make-before-break while active
	// serves (nil: none); it becomes active once every stage is READY.
	next        *Placement
	restored    *Placement
	nextVersion uint64

	dispatching bool      // the stage-0 link is up: batches flow
	linking     bool      // a stage-0 link is being opened
	linkRetryAt time.Time // no link is opened before
	linkDown    time.Time // since when stage 0's stream is down (zero: up or not tried)
	// busySince is since when batches have been in flight without any of
	// them getting an answer (zero: none in flight); see Progress.
	busySince time.Time
	// tokens is how many tokens the batches in flight carry (decode rows
	// count one, a prefill chunk its length); see Progress.
	tokens int
	// misses counts the progress deadlines passed since the last answer:
	// each doubles the next deadline (up to 8×), so a batch that is only
	// slow — a prefill chunk longer than the decode-scaled deadline — gets
	// the time it needs on its retries instead of failing every one of them.
	misses int

	notReady    time.Time // since when no pipeline is ready (zero: ready)
	notReadyWhy string
	lastLoss    string // the latest loss of a placed shard since the last placement
	cannotPlace bool   // a pipeline had formed, and the shards left cannot hold the model
	overruled   uint64 // gossip deaths and leaves ignored
	replanned   uint64 // the active version an ActReplan was last returned for
	// replanSkipped says why the latest markedly faster placement was not
	// staged ("" for none since the active placement was made).
	replanSkipped string

	out []Action
}

// New returns a core with no shards, not ready.
func New(cfg Config) (*Core, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Mix == "" {
		cfg.Mix = MixBalanced
	}
	c := &Core{cfg: cfg, shards: map[string]*shard{}, restored: cfg.Restored, nextVersion: 1,
		notReady: cfg.Start, notReadyWhy: fmt.Sprintf("waiting for shards (0 of --min-shards %d connected)", cfg.MinShards)}
	if cfg.Restored != nil {
		c.nextVersion = cfg.Restored.Version + 1
	}
	return c, nil
}

// take returns the actions queued since the last call.
func (c *Core) take() []Action {
	out := c.out
	c.out = nil
	return out
}

func (c *Core) emit(a Action) { c.out = append(c.out, a) }

// Register records a shard process (a Register call the shell accepted).
// Registering again under the same ID keeps its place in the order and
// clears its loss and load failure. A different process of the same node
// (a new incarnation) must be Forgotten first.
func (c *Core) Register(info ShardInfo, now time.Time) []Action {
	s := c.shards[info.ID]
	if s == nil {
		s = &shard{}
		c.shards[info.ID] = s
	} else {
		info.Registered = s.Registered
		s.lost, s.failed = false, ""
	}
	s.ShardInfo = info
	if c.next.stageOf(info.ID) >= 0 {
		// Its memory may have shrunk below both ranges at once.
		if short := c.stagingShort(c.next); short != "" {
			c.abandon(short)
		}
	}
	return c.take()
}

// Forget removes a shard from the registry: replaced by a new incarnation
// (why says so, and it is a loss of the old process) or expired (why
// empty: it is disconnected and unplaced, nothing to lose).
func (c *Core) Forget(id, why string, now time.Time) []Action {
	s := c.shards[id]
	if s == nil {
		return nil
	}
	if why != "" {
		c.lose(s, why, now)
	}
	if c.next.stageOf(id) >= 0 {
		c.abandon(fmt.Sprintf("shard %s forgotten", id))
	}
	if s.connected {
		c.emit(Action{Kind: ActCut, Shard: id})
	}
	delete(c.shards, id)
	return c.take()
}

// StreamUp: shard id's control stream opened. The shard is evidently
// alive: a loss is lifted (the placement it broke has moved on, so it
// returns as a spare). A placed shard not READY for the active version
// gets its Assign again; a shard that held a range of an older placement
// and holds none now gets a spare Assign.
func (c *Core) StreamUp(id string, now time.Time) []Action {
	s := c.shards[id]
	if s == nil {
		return nil
	}
	s.connected = true
	s.lost = false // it is evidently alive
	s.alive = later(s.alive, now)
	if i := c.active.stageOf(id); i >= 0 && s.ready != c.active.Version {
		c.emit(Action{Kind: ActAssign, Shard: id, Stage: i, Placement: c.active})
	} else if i < 0 && s.assigned && c.active != nil && c.next.stageOf(id) < 0 {
		s.assigned = false
		c.emit(Action{Kind: ActSpare, Shard: id, Placement: c.active})
	}
	if i := c.next.stageOf(id); i >= 0 && s.staged != c.next.Version {
		c.emit(Action{Kind: ActAssign, Shard: id, Stage: i, Placement: c.next})
	}
	c.considerReplan()
	return c.take()
}

// StreamDown: shard id's control stream closed (err says how). The stream
// is the truth: a placed shard whose stream broke is lost now, not after a
// confirmation. Waiting would keep every stream silent and save only the
// KV of the in-flight sequences, which recomputation restores
// token-identically. A stream that comes back is a rejoin.
func (c *Core) StreamDown(id string, err error, now time.Time) []Action {
	s := c.shards[id]
	if s == nil {
		return nil
	}
	s.connected = false
	if c.active.stageOf(id) >= 0 {
		c.lose(s, fmt.Sprintf("control stream closed: %v", err), now)
	}
	if c.next.stageOf(id) >= 0 {
		c.abandon(fmt.Sprintf("shard %s's control stream closed: %v", id, err))
	}
	return c.take()
}

// StageTime: shard id's heartbeats report a mean of mean per batch it
// computed since its previous report (its measured stage time).
func (c *Core) StageTime(id string, mean time.Duration) []Action {
	if s := c.shards[id]; s != nil && mean > 0 {
		s.measured = mean
	}
	return nil
}

// Progress: since busySince batches have been in flight and none of them
// got an answer (a result or a failure); zero when none is in flight; they
// carry tokens tokens (decode rows one each, prefill chunks their length).
// The shell reports it whenever it changes (a dispatch, an answer). Tick
// declares the pipeline stuck when that lasts past the progress deadline
// (ProgressDeadline).
//
// An answer shows as the clock moving while it runs: to a later time
// (batches still in flight) or to zero (none left); a dispatch into an idle
// pipeline starts it from zero, and a pause (a passed deadline included)
// zeroes the core's own clock first, so neither counts as an answer.
func (c *Core) Progress(busySince time.Time, tokens int, now time.Time) []Action {
	if !c.busySince.IsZero() && (busySince.IsZero() || busySince.After(c.busySince)) {
		c.misses = 0
	}
	c.busySince = busySince
	c.tokens = tokens
	if busySince.IsZero() {
		c.tokens = 0
	}
	return nil
}

// The progress deadline: a dispatching pipeline whose batches in flight
// get no answer for progressFactor times its step time (the sum of its
// stages' times: each the larger of its prediction and its measured mean)
// plus prefillFactor times what its stages are predicted to take for the
// tokens in flight (each stage's calibrated prefill time per token and
// layer, times its layers, stretched by how much slower than predicted the
// stage measures) is stuck, but never before progressFloor, and after
// progressUnknown when a stage has neither time. The floor is 30 s: below
// it, scheduling noise, a garbage collection, a loaded machine or a shard
// paused for seconds would fail batches that were only slow. The token
// term is what lets a 512-token chunk of a large model on a CPU — a minute
// or more, many decode steps — finish on its first attempt instead of
// being failed, recomputed and failed again until the request runs out of
// retries.
const (
	progressFactor  = 20
	prefillFactor   = 4
	progressFloor   = 30 * time.Second
	progressUnknown = 30 * time.Second
)

// ProgressDeadline returns how long the active pipeline's batches in
// flight may go without an answer before it is declared stuck.
func (c *Core) ProgressDeadline() time.Duration {
	if c.active == nil {
		return progressUnknown
	}
	var step, prefill time.Duration
	for _, st := range c.active.Stages {
		pred := time.Duration(st.PredictedNs)
		t := pred
		s := c.shards[st.ShardID]
		if s != nil {
			t = max(t, s.measured)
		}
		if t <= 0 {
			return progressUnknown
		}
		step += t
		if s != nil && c.tokens > 0 {
			prefill += s.prefillTime(c.tokens, st.End-st.First, pred, t)
		}
	}
	return max(progressFloor, progressFactor*step+prefillFactor*prefill) << min(c.misses, maxMissShift)
}

// prefillTime is what the shard's calibration predicts for tokens prompt
// tokens through layers of its layers, scaled by took/pred (a stage
// measured slower than predicted is slower at prompts too); zero without a
// calibration.
func (s *shard) prefillTime(tokens, layers int, pred, took time.Duration) time.Duration {
	sp := s.Speed
	if sp == nil || sp.PrefillTokens <= 0 || sp.Layers <= 0 || sp.Prefill <= 0 {
		return 0
	}
	t := float64(sp.Prefill) / float64(sp.PrefillTokens) / float64(sp.Layers) * float64(layers) * float64(tokens)
	if pred > 0 && took > pred {
		t *= float64(took) / float64(pred)
	}
	return time.Duration(t)
}

// maxMissShift caps the deadline's doubling after passed deadlines at 8×.
const maxMissShift = 3

// Heartbeat: shard id's control stream answered.
func (c *Core) Heartbeat(id string, now time.Time) []Action {
	if s := c.shards[id]; s != nil {
		s.alive = later(s.alive, now)
	}
	return nil
}

// Loaded: shard id reports READY for placement version (a report of
// another version is ignored).
func (c *Core) Loaded(id string, version uint64, now time.Time) []Action {
	s := c.shards[id]
	if s != nil && c.next != nil && version == c.next.Version && c.next.stageOf(id) >= 0 {
		s.staged = version
		c.emit(Action{Kind: ActLoaded, Shard: id, Placement: c.next})
		c.switchNext(now)
		return c.take()
	}
	if s == nil || c.active == nil || version != c.active.Version {
		return nil
	}
	s.ready = version
	c.emit(Action{Kind: ActLoaded, Shard: id, Placement: c.active})
	return c.take()
}

// LoadFailed: shard id failed to load its range of placement version (why
// says how; a report of another version is ignored). It is the shard's
// loss, and it is no candidate until it registers again.
func (c *Core) LoadFailed(id string, version uint64, why string, now time.Time) []Action {
	s := c.shards[id]
	if s != nil && c.next != nil && version == c.next.Version {
		// The active placement serves on: the shard is no loss (it may
		// simply lack the memory for two ranges at once).
		c.emit(Action{Kind: ActLoadFailed, Shard: id, Placement: c.next, Reason: why})
		c.abandon(fmt.Sprintf("shard %s failed to load: %s", id, why))
		return c.take()
	}
	if s == nil || c.active == nil || version != c.active.Version {
		return nil
	}
	s.failed = why
	c.emit(Action{Kind: ActLoadFailed, Shard: id, Placement: c.active, Reason: why})
	c.lose(s, "load failed: "+why, now)
	return c.take()
}

// Member: gossip reports kind for the shard process (nodeID,
// incarnation). Membership is a hint, the control stream is the truth: a
// death or leave is a loss only when the shard's stream is down or has
// shown no life for LossConfirm. A live, answering stream outweighs gossip
// — which anyone who can gossip may forge: a member claiming a healthy
// shard's node ID and then leaving takes nothing away.
func (c *Core) Member(nodeID string, incarnation uint64, kind MemberKind, now time.Time) []Action {
	if kind != MemberDead && kind != MemberLeft {
		return nil
	}
	for _, id := range c.ids() {
		s := c.shards[id]
		if s.NodeID != nodeID || s.Incarnation != incarnation {
			continue
		}
		if s.connected && c.answering(s, now) {
			c.overruled++
			c.emit(Action{Kind: ActOverruled, Shard: id, Reason: "membership: " + kind.String()})
			continue
		}
		if s.connected {
			// Silent and declared gone: cut the stream, so that if the
			// shard is alive after all, its return is a rejoin.
			s.connected = false
			c.emit(Action{Kind: ActCut, Shard: id})
		}
		c.lose(s, "membership: "+kind.String(), now)
	}
	return c.take()
}

// answering reports whether s's control stream has shown life within
// LossConfirm.
func (c *Core) answering(s *shard, now time.Time) bool {
	return now.Sub(s.alive) < c.cfg.LossConfirm
}

// LinkUp: the stage-0 link of placement version opened (the one
// ActOpenLink asked for). It returns ActResume, or nothing when the link
// is no longer wanted (the shell then closes it).
func (c *Core) LinkUp(version uint64, now time.Time) []Action {
	if !c.linking || c.active == nil || version != c.active.Version {
		return nil
	}
	c.linking, c.dispatching = false, true
	c.linkDown = time.Time{}
	c.notReady, c.notReadyWhy = time.Time{}, ""
	c.emit(Action{Kind: ActResume, Shard: c.active.Stages[0].ShardID, Placement: c.active})
	c.considerReplan() // a faster shard may have joined while this one loaded
	return c.take()
}

// LinkDown: the stage-0 link being opened failed, or the one dispatching
// broke (the shell reports only those, not a link it had already
// dropped). Dispatch pauses; the link is tried again after a short wait,
// and stage 0 is lost when its stage stream stays down for LossConfirm.
func (c *Core) LinkDown(shardID string, err error, now time.Time) []Action {
	if !c.linking && !c.dispatching {
		return nil
	}
	c.linking = false
	if c.linkDown.IsZero() {
		c.linkDown = now
	}
	c.linkRetryAt = now.Add(linkRetry)
	c.pause(fmt.Sprintf("stage-0 link to %s: %v", shardID, err), now)
	return c.take()
}

// linkRetry is how long after a stage-0 link failed it is opened again.
const linkRetry = 250 * time.Millisecond

// DownstreamBackoff is how long the pipeline stays paused after a stage
// reports its downstream unreachable before the stage-0 link is reopened:
// long enough for the broken shard's control stream or membership to
// report the loss (which then holds the pipeline until a new placement),
// so that requests are not dispatched again and again into a pipeline
// with a hole, each try costing them a retry.
const DownstreamBackoff = time.Second

// Downstream: a stage of placement version failed a whole batch because
// the stage after it (or the coordinator's Results) is unreachable.
func (c *Core) Downstream(version uint64, shardID, reason string, now time.Time) []Action {
	if c.active == nil || c.active.Version != version || !c.dispatching {
		return nil
	}
	c.linkRetryAt = now.Add(DownstreamBackoff)
	c.pause(fmt.Sprintf("shard %s: %s", shardID, reason), now)
	return c.take()
}

// Tick moves the cluster toward a ready pipeline: it confirms the loss of
// a stage 0 whose stage stream stays down, places when no placement is
// active or the active one lost a shard, and opens the stage-0 link once
// every stage is READY.
func (c *Core) Tick(now time.Time) []Action {
	if c.dispatching && !c.busySince.IsZero() {
		if d := c.ProgressDeadline(); now.Sub(c.busySince) >= d {
			// Stuck: no stage says which. Its batches fail (their requests
			// are recomputed) and the link is opened again; a shard that is
			// gone shows as a loss on its own.
			c.busySince = time.Time{}
			c.misses++
			c.linkRetryAt = now.Add(linkRetry)
			c.pause(fmt.Sprintf("placement %d: no batch answered for %v (progress deadline)", c.active.Version, d), now)
		}
	}
	if c.active != nil && !c.linkDown.IsZero() && now.Sub(c.linkDown) >= c.cfg.LossConfirm {
		if s := c.shards[c.active.Stages[0].ShardID]; s != nil {
			c.lose(s, fmt.Sprintf("no stage stream for %v", c.cfg.LossConfirm), now)
		}
		c.linkDown = time.Time{}
	}
	if c.active == nil || c.broken(c.active) {
		c.place(now)
		return c.take()
	}
	// Whole again (a lost shard of it came back): whatever pauses it next
	// is no longer "nothing can hold the model".
	c.cannotPlace = false
	if c.dispatching || c.linking || now.Before(c.linkRetryAt) {
		return c.take()
	}
	waiting := 0
	for _, st := range c.active.Stages {
		s := c.shards[st.ShardID]
		if !s.connected || s.ready != c.active.Version {
			waiting++
		}
	}
	if waiting > 0 {
		c.setNotReady(fmt.Sprintf("placement %d: %d of %d stages loading", c.active.Version, waiting, len(c.active.Stages)), now)
		return c.take()
	}
	c.linking = true
	c.emit(Action{Kind: ActOpenLink, Shard: c.active.Stages[0].ShardID, Placement: c.active})
	return c.take()
}

// lose declares s lost: it leaves placement until its control stream
// opens again (or it registers again), and a placement holding it is
// broken: the pipeline pauses (its in-flight batches fail, their requests
// are requeued) and the next Tick re-places at once.
func (c *Core) lose(s *shard, why string, now time.Time) {
	if s.lost {
		return
	}
	s.lost = true
	c.emit(Action{Kind: ActLost, Shard: s.ID, Reason: why})
	if c.next.stageOf(s.ID) >= 0 {
		c.abandon(fmt.Sprintf("shard %s lost: %s", s.ID, why))
	}
	if c.active.stageOf(s.ID) >= 0 {
		c.lastLoss = fmt.Sprintf("shard %s lost: %s", s.ID, why)
		c.pause(c.lastLoss, now)
	}
}

// pause stops dispatch (and any link being opened) and records why.
func (c *Core) pause(why string, now time.Time) {
	c.dispatching, c.linking = false, false
	c.busySince = time.Time{} // the shell fails the batches in flight
	c.emit(Action{Kind: ActPause, Reason: why})
	c.setNotReady(why, now)
}

func (c *Core) setNotReady(why string, now time.Time) {
	if c.notReady.IsZero() {
		c.notReady = now
	}
	c.notReadyWhy = why
}

// broken reports whether p names a shard that is gone.
func (c *Core) broken(p *Placement) bool {
	for _, st := range p.Stages {
		s := c.shards[st.ShardID]
		if s == nil || s.lost || s.failed != "" {
			return true
		}
	}
	return false
}

// candidates returns the shards placement may use: connected, not lost,
// not failed, in registration order.
func (c *Core) candidates() []*shard {
	var out []*shard
	for _, s := range c.shards {
		if s.connected && !s.lost && s.failed == "" {
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b *shard) int {
		if d := a.Registered.Compare(b.Registered); d != 0 {
			return d
		}
		return cmp.Compare(a.ID, b.ID)
	})
	return out
}

// capacities returns what cands offer to placement.
func (c *Core) capacities(cands []*shard) []Capacity {
	caps := make([]Capacity, len(cands))
	for i, s := range cands {
		kvm := s.KVMemory
		if c.cfg.KVMemory > 0 && (kvm == 0 || kvm > c.cfg.KVMemory) {
			kvm = c.cfg.KVMemory
		}
		caps[i] = Capacity{ShardID: s.ID, NodeID: s.NodeID, Incarnation: s.Incarnation,
			Addr: s.Addr, Memory: s.Memory, KVMemory: kvm, Speed: s.Speed}
	}
	return caps
}

// place makes a new placement: the restored one when all its shards came
// back after a coordinator restart, else a fresh plan over the candidates.
// The first formation waits for MinShards of them; after it, a loss is
// re-placed onto whatever is left (degraded is better than down), and only
// when that cannot hold the model is CannotPlace set.
func (c *Core) place(now time.Time) {
	cands := c.candidates()
	var p *Placement
	if c.restored != nil {
		p = c.restore(cands)
		if p == nil && now.Sub(c.cfg.Start) < c.cfg.LossConfirm {
			c.setNotReady(fmt.Sprintf("waiting for the shards of placement %d to return", c.restored.Version), now)
			return
		}
		c.restored = nil
	}
	if p == nil {
		if c.active == nil && len(cands) < c.cfg.MinShards {
			c.setNotReady(fmt.Sprintf("waiting for shards (%d of --min-shards %d connected)", len(cands), c.cfg.MinShards), now)
			return
		}
		var err error
		if p, err = PlanFor(c.cfg.Shape, c.capacities(cands), c.cfg.Mix, c.nextVersion, c.cfg.Epoch); err != nil {
			why := fmt.Sprintf("cannot place the model on %d shards: %v", len(cands), err)
			if c.lastLoss != "" {
				why = fmt.Sprintf("%s; cannot place the model on the shards left (%d): %v", c.lastLoss, len(cands), err)
			}
			c.cannotPlace = c.active != nil
			c.setNotReady(why, now)
			return
		}
	}
	p.Version, p.Epoch = c.nextVersion, c.cfg.Epoch
	c.activate(p, now)
}

// restore returns the restored placement under a new version if every one
// of its stages' nodes is back and connected: the same process, or a new
// incarnation of the same node ID (a restarted shard, whose weight cache
// holds that range). After a coordinator restart no shard keeps KV of the
// old epoch, so a new incarnation is as good as the old one.
func (c *Core) restore(cands []*shard) *Placement {
	p := *c.restored
	p.Stages = slices.Clone(p.Stages)
	used := map[string]bool{}
	for i, st := range p.Stages {
		j := slices.IndexFunc(cands, func(s *shard) bool {
			return !used[s.ID] && s.NodeID == st.NodeID && s.Incarnation == st.Incarnation
		})
		if j < 0 {
			j = slices.IndexFunc(cands, func(s *shard) bool { return !used[s.ID] && s.NodeID == st.NodeID })
		}
		if j < 0 {
			return nil
		}
		s := cands[j]
		used[s.ID] = true
		p.Stages[i].ShardID, p.Stages[i].Incarnation, p.Stages[i].Addr = s.ID, s.Incarnation, s.Addr
	}
	return &p
}

// activate makes p the placement: the pipeline paused until every stage
// is READY, p persisted and switched to, Assigns sent, and shards that
// held a range and have none now made spares.
func (c *Core) activate(p *Placement, now time.Time) {
	if c.next != nil {
		// Its shards get p's Assigns or spares below.
		for _, st := range c.next.Stages {
			c.shards[st.ShardID].staged = 0
		}
		c.emit(Action{Kind: ActAbandon, Placement: c.next, Reason: fmt.Sprintf("placement %d replaces it", p.Version)})
		c.next = nil
	}
	c.pause(fmt.Sprintf("placement %d: loading", p.Version), now)
	c.emit(Action{Kind: ActActivate, Placement: p})
	c.nextVersion = p.Version + 1
	c.active = p
	c.linkDown, c.linkRetryAt = time.Time{}, time.Time{} // a new placement: new links
	c.lastLoss, c.cannotPlace, c.replanSkipped = "", false, ""
	for i, st := range p.Stages {
		c.shards[st.ShardID].assigned = true
		c.emit(Action{Kind: ActAssign, Shard: st.ShardID, Stage: i, Placement: p})
	}
	c.spareUnplaced(p)
}

// spareUnplaced sends a spare Assign of p to every connected shard that
// held a range and holds none in p.
func (c *Core) spareUnplaced(p *Placement) {
	for _, id := range c.ids() {
		s := c.shards[id]
		if s.assigned && p.stageOf(id) < 0 && s.connected {
			s.assigned = false
			c.emit(Action{Kind: ActSpare, Shard: id, Placement: p})
		}
	}
}

// considerReplan starts a make-before-break re-placement, once per active
// version, when a placement over the candidates now would predict a
// slowest stage replanGain times faster than the active one's (a markedly
// faster shard joined, or a loss healed). Both need every stage's
// prediction, and the active placement must be dispatching (one still
// loading is not worth keeping: it is replaced the usual way when it
// breaks, and re-planned once it serves).
func (c *Core) considerReplan() {
	if c.active == nil || !c.dispatching || c.next != nil || c.broken(c.active) || c.replanned == c.active.Version {
		return
	}
	cur := bottleneck(c.active)
	if cur == 0 {
		return
	}
	p, err := PlanFor(c.cfg.Shape, c.capacities(c.candidates()), c.cfg.Mix, c.nextVersion, c.cfg.Epoch)
	if err != nil {
		return
	}
	if next := bottleneck(p); next > 0 && float64(cur) >= replanGain*float64(next) {
		if short := c.stagingShort(p); short != "" {
			// Staging it would overcommit a shard that serves a range
			// (its load fails at best, the process is killed at worst);
			// breaking the serving pipeline to place it is what a loss
			// does, not a gain. The active placement serves on; a later
			// event (a shard joining, one leaving) may make a plan that
			// fits.
			why := fmt.Sprintf("a placement predicting a slowest stage of %v (now %v) is not staged: %s",
				time.Duration(next), time.Duration(cur), short)
			if why != c.replanSkipped {
				c.replanSkipped = why
				c.emit(Action{Kind: ActWarn, Placement: p, Reason: why})
			}
			return
		}
		c.replanned = c.active.Version
		c.replanSkipped = ""
		p.Version, p.Epoch = c.nextVersion, c.cfg.Epoch
		c.nextVersion++
		c.next = p
		c.emit(Action{Kind: ActReplan, Placement: p, Reason: fmt.Sprintf("slowest stage predicted %v, now %v",
			time.Duration(next), time.Duration(cur))})
		for i, st := range p.Stages {
			c.shards[st.ShardID].assigned = true // it holds a range: a spare Assign drops it
			c.emit(Action{Kind: ActAssign, Shard: st.ShardID, Stage: i, Placement: p})
		}
	}
}

// stagingShort returns why p cannot be loaded make-before-break beside
// the active placement ("" when it can): a shard that serves a range
// keeps it, and the KV pool of it, until the switch, so it must hold both
// ranges' weights and both pools' shares within its memory at once. The
// weights are counted twice even where the ranges overlap: a GPU shard
// uploads each range on its own.
func (c *Core) stagingShort(p *Placement) string {
	for _, st := range p.Stages {
		i := c.active.stageOf(st.ShardID)
		s := c.shards[st.ShardID]
		if i < 0 || s == nil {
			continue // it holds nothing now: p's plan checked its memory
		}
		old := c.active.Stages[i]
		held := c.cfg.Shape.stageBytes(old, c.active.Blocks)
		need := held + c.cfg.Shape.stageBytes(st, p.Blocks)
		if need > s.Memory {
			return fmt.Sprintf("shard %s cannot hold layers [%d,%d) (%d bytes with its KV) beside the [%d,%d) it serves (%d bytes): %d bytes, its memory is %d",
				st.ShardID, st.First, st.End, need-held, old.First, old.End, held, need, s.Memory)
		}
	}
	return ""
}

// switchNext makes the make-before-break placement active once every one
// of its stages is connected and READY for it: a switch at a batch
// boundary (the pause fails the batches in flight; the engine drops the
// old version's sequences and recomputes them on the new one).
func (c *Core) switchNext(now time.Time) {
	p := c.next
	for _, st := range p.Stages {
		if s := c.shards[st.ShardID]; !s.connected || s.lost || s.staged != p.Version {
			return
		}
	}
	c.next = nil
	c.pause(fmt.Sprintf("placement %d: switching to placement %d (make-before-break)", c.active.Version, p.Version), now)
	c.emit(Action{Kind: ActActivate, Placement: p})
	c.active = p
	c.linkDown, c.linkRetryAt = time.Time{}, time.Time{}
	c.lastLoss, c.cannotPlace, c.replanSkipped = "", false, ""
	for _, st := range p.Stages {
		s := c.shards[st.ShardID]
		s.assigned, s.ready, s.staged = true, p.Version, 0
	}
	c.spareUnplaced(p)
}

// abandon gives up the make-before-break placement (why says why): the
// shards that were loading it and are connected are sent their part of
// the active placement again (a spare Assign when they have none), which
// drops what they loaded. When the active placement is broken too, the
// next Tick re-places, and its Assigns and spares do that instead.
func (c *Core) abandon(why string) {
	p := c.next
	if p == nil {
		return
	}
	c.next = nil
	c.emit(Action{Kind: ActAbandon, Placement: p, Reason: why})
	broken := c.broken(c.active)
	for _, st := range p.Stages {
		s := c.shards[st.ShardID]
		if s == nil {
			continue
		}
		s.staged = 0
		if !s.connected || s.lost || broken {
			continue
		}
		if i := c.active.stageOf(s.ID); i >= 0 {
			c.emit(Action{Kind: ActAssign, Shard: s.ID, Stage: i, Placement: c.active})
		} else {
			s.assigned = false
			c.emit(Action{Kind: ActSpare, Shard: s.ID, Placement: c.active})
		}
	}
}

// bottleneck returns p's slowest stage's predicted time, 0 when a stage has
// no prediction.
func bottleneck(p *Placement) int64 {
	var m int64
	for _, st := range p.Stages {
		if st.PredictedNs <= 0 {
			return 0
		}
		m = max(m, st.PredictedNs)
	}
	return m
}

// ids returns the shard IDs in order, so that actions come out in the
// same order for the same events.
func (c *Core) ids() []string {
	ids := make([]string, 0, len(c.shards))
	for id := range c.shards {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// stageOf returns the index of shardID in p, or -1 (also for a nil p).
func (p *Placement) stageOf(shardID string) int {
	if p == nil {
		return -1
	}
	return slices.IndexFunc(p.Stages, func(st Stage) bool { return st.ShardID == shardID })
}

// Active returns the active placement (nil before the first). It is not
// changed afterwards: a new one replaces it.
func (c *Core) Active() *Placement { return c.active }

// Next returns the placement being loaded make-before-break (nil: none).
func (c *Core) Next() *Placement { return c.next }

// Restored returns the persisted placement still waited for (nil once
// made again or given up).
func (c *Core) Restored() *Placement { return c.restored }

// Dispatching reports whether the stage-0 link is up and batches flow.
func (c *Core) Dispatching() bool { return c.dispatching }

// NotReady returns since when and why no pipeline dispatches (zero and
// "" while one does), and whether that is because the shards left after a
// loss cannot hold the model.
func (c *Core) NotReady() (since time.Time, why string, cannotPlace bool) {
	return c.notReady, c.notReadyWhy, c.cannotPlace
}

// ReplanSkipped says why the latest markedly faster placement was not
// loaded make-before-break ("" when none was skipped since the active
// placement was made, or one is being loaded).
func (c *Core) ReplanSkipped() string { return c.replanSkipped }

// Overruled counts the gossip deaths and leaves ignored because the
// shard's control stream was alive and answering.
func (c *Core) Overruled() uint64 { return c.overruled }

// Shard returns the core's view of shard id.
func (c *Core) Shard(id string) (ShardState, bool) {
	s := c.shards[id]
	if s == nil {
		return ShardState{}, false
	}
	return ShardState{ShardInfo: s.ShardInfo, Connected: s.connected, Lost: s.lost, Failed: s.failed, Ready: s.ready, Staged: s.staged}, true
}

// CheckInvariants returns the first broken rule of the core's state, for
// tests (after every event).
func (c *Core) CheckInvariants() error {
	if p := c.active; p != nil {
		if err := wellFormed(p, c.cfg.Shape.Layers); err != nil {
			return fmt.Errorf("active placement %d: %w", p.Version, err)
		}
		if p.Version >= c.nextVersion {
			return fmt.Errorf("active placement %d not below the next version %d", p.Version, c.nextVersion)
		}
	}
	if p := c.next; p != nil {
		if err := wellFormed(p, c.cfg.Shape.Layers); err != nil {
			return fmt.Errorf("next placement %d: %w", p.Version, err)
		}
		if c.active == nil || p.Version <= c.active.Version || p.Version >= c.nextVersion {
			return fmt.Errorf("next placement %d not between the active one and the next version %d", p.Version, c.nextVersion)
		}
		for _, st := range p.Stages {
			if s := c.shards[st.ShardID]; s == nil || s.lost || s.failed != "" {
				return fmt.Errorf("next placement %d names shard %s, which is gone", p.Version, st.ShardID)
			}
		}
		if short := c.stagingShort(p); short != "" {
			return fmt.Errorf("next placement %d overcommits a shard: %s", p.Version, short)
		}
	}
	for id, s := range c.shards {
		if s.staged != 0 && (c.next == nil || s.staged != c.next.Version) {
			return fmt.Errorf("shard %s staged for placement %d, which is not the one being loaded", id, s.staged)
		}
	}
	if c.dispatching || c.linking {
		if c.dispatching && c.linking {
			return errors.New("dispatching and opening a link at once")
		}
		if c.active == nil {
			return errors.New("dispatching (or linking) without a placement")
		}
		for _, st := range c.active.Stages {
			s := c.shards[st.ShardID]
			switch {
			case s == nil:
				return fmt.Errorf("placement %d serves with shard %s, which is not registered", c.active.Version, st.ShardID)
			case s.lost:
				return fmt.Errorf("placement %d serves with shard %s, which is lost", c.active.Version, st.ShardID)
			case s.failed != "":
				return fmt.Errorf("placement %d serves with shard %s, which failed to load", c.active.Version, st.ShardID)
			case !s.connected:
				return fmt.Errorf("placement %d serves with shard %s, whose control stream is down", c.active.Version, st.ShardID)
			case s.ready != c.active.Version:
				return fmt.Errorf("placement %d serves with shard %s, not READY for it", c.active.Version, st.ShardID)
			}
		}
	}
	switch {
	case c.dispatching && (c.notReadyWhy != "" || !c.notReady.IsZero()):
		return fmt.Errorf("dispatching, yet not ready since %v: %q", c.notReady, c.notReadyWhy)
	case !c.dispatching && (c.notReadyWhy == "" || c.notReady.IsZero()):
		return fmt.Errorf("not dispatching, without a reason (%q) or a time (%v)", c.notReadyWhy, c.notReady)
	case c.cannotPlace && (c.active == nil || !c.broken(c.active)):
		return errors.New("cannot place, yet no placement had formed or the active one is whole")
	}
	return nil
}

// wellFormed checks that p covers layers [0, layers) with contiguous,
// non-empty ranges, one owner per layer and each shard once, the
// embedding on the first stage and the head on the last.
func wellFormed(p *Placement, layers int) error {
	if len(p.Stages) == 0 {
		return errors.New("no stages")
	}
	seen := map[string]bool{}
	next := 0
	for i, st := range p.Stages {
		switch {
		case seen[st.ShardID]:
			return fmt.Errorf("shard %s holds two stages", st.ShardID)
		case st.First != next:
			return fmt.Errorf("stage %d (%s) starts at layer %d, want %d: a layer with two owners or none", i, st.ShardID, st.First, next)
		case st.End <= st.First:
			return fmt.Errorf("stage %d (%s) holds no layer: [%d,%d)", i, st.ShardID, st.First, st.End)
		case st.Embed != (i == 0):
			return fmt.Errorf("stage %d (%s): embed %v", i, st.ShardID, st.Embed)
		case st.Head != (i == len(p.Stages)-1):
			return fmt.Errorf("stage %d (%s): head %v", i, st.ShardID, st.Head)
		}
		seen[st.ShardID] = true
		next = st.End
	}
	if next != layers {
		return fmt.Errorf("the stages end at layer %d of %d", next, layers)
	}
	if p.Blocks < 1 {
		return fmt.Errorf("a KV pool of %d blocks", p.Blocks)
	}
	return nil
}
