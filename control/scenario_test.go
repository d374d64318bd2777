package control

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// rewrite regenerates the expected output of testdata/scenarios/*.txt from
// what the core does now. Read the diff before committing it: the files
// are the control plane's specification.
var rewrite = flag.Bool("rewrite", false, "rewrite testdata/scenarios with the core's current output")

// t0 is the scenarios' clock at config.
var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// TestScenarios plays the scripts of testdata/scenarios event by event, the
// way the coordinator's loop drives the core: each event, then Tick at the
// same time. After every command it checks the core's invariants and the
// script's own (below), and compares what the event and the Tick returned
// with the script. The format is sched's (datadriven's):
//
//	# a comment
//	command key=value ...
//	----
//	expected output, up to a blank line
//
// Commands:
//
//	config [layers=N] [min=N] [confirm=D] [kv=BYTES] [mix=M]
//	                                       a new core (defaults: 4 layers of 1000
//	                                       bytes, embed and head 500 each, a KV
//	                                       block-layer 100 bytes; min 1; confirm 10s)
//	register id=S [node=N] [inc=I] mem=BYTES [kvmem=BYTES] [speed=D]
//	                                       Register (node defaults to S, inc to 1);
//	                                       another shard of the same node is
//	                                       Forgotten first, as a new incarnation;
//	                                       speed D is a decode row's time per layer
//	up id=S | down id=S [err=E]            its control stream opens / closes
//	heartbeat id=S                         its stream answers
//	measured id=S mean=D                   its heartbeats report D per batch
//	busy [tokens=N] | idle                 batches carrying N tokens (default 0)
//	                                       are in flight, none answered since now
//	                                       (an answer also says busy) / none is in
//	                                       flight (Progress)
//	deadline                               print the progress deadline
//	loaded id=S [v=N] | failed id=S [v=N] why=W
//	                                       READY / FAILED for version N (the active)
//	member node=N [inc=I] kind=alive|suspect|dead|leave
//	link up | link down [err=E]            the stage-0 link asked for opened / broke
//	downstream [shard=S]                   a stage's downstream is unreachable
//	forget id=S                            expired from the registry
//	advance d=D                            move the clock, then Tick
//	tick                                   Tick
//	show                                   the placement and every shard
//
// Each action prints on a line (see printAction); a change of readiness
// prints "ready" or "not-ready: <why>" (with "[cannot place]" when the
// shards left cannot hold the model) after the actions.
func TestScenarios(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "scenarios", "*.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no scenarios in testdata/scenarios")
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) { runScenario(t, f) })
	}
}

// scenario is one script's state.
type scenario struct {
	t      *testing.T
	c      *Core
	cfg    Config
	now    time.Time
	ids    []string // registered, in order
	formed bool     // a placement has been made
	// reported holds the (shard, version) READY reports the script sent.
	reported map[string]map[uint64]bool
}

type scenarioCase struct {
	line     int
	cmd      string
	args     map[string]string
	keys     []string
	expected string
}

func runScenario(t *testing.T, path string) {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cases, err := parseScenario(string(data))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	sc := &scenario{t: t}
	var out strings.Builder
	for _, c := range cases {
		got := sc.do(c)
		if *rewrite {
			fmt.Fprintf(&out, "%s\n----\n%s\n", c.cmd+formatArgs(c), got)
			continue
		}
		if diff := cmp.Diff(got, c.expected); diff != "" {
			t.Fatalf("%s:%d: %s (-got +want):\n%s", path, c.line, c.cmd, diff)
		}
	}
	if *rewrite {
		if err := os.WriteFile(path, []byte(keepComments(string(data), out.String())), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// parseScenario splits a script into its commands.
func parseScenario(s string) ([]scenarioCase, error) {
	lines := strings.Split(s, "\n")
	var cases []scenarioCase
	for i := 0; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		f := strings.Fields(l)
		c := scenarioCase{line: i + 1, cmd: f[0], args: map[string]string{}}
		for _, a := range f[1:] {
			k, v, _ := strings.Cut(a, "=")
			c.args[k] = v
			c.keys = append(c.keys, k)
		}
		i++
		if i >= len(lines) || lines[i] != "----" {
			if *rewrite { // a new command: its output is written
				cases = append(cases, c)
				i--
				continue
			}
			return nil, fmt.Errorf("line %d: %q is not followed by ----", c.line, l)
		}
		var exp []string
		for i++; i < len(lines) && lines[i] != ""; i++ {
			exp = append(exp, lines[i])
		}
		if len(exp) > 0 {
			c.expected = strings.Join(exp, "\n") + "\n"
		}
		cases = append(cases, c)
	}
	return cases, nil
}

// keepComments rewrites a script: the comment paragraphs of old stay
// before the command that followed them; commands and outputs come from
// out.
func keepComments(old, out string) string {
	var comments []string
	var cur []string
	lines := strings.Split(old, "\n")
	for i := 0; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		switch {
		case strings.HasPrefix(l, "#"):
			cur = append(cur, lines[i])
		case l == "":
		default:
			comments = append(comments, strings.Join(cur, "\n"))
			cur = nil
			for i++; i < len(lines) && lines[i] != ""; i++ {
			}
		}
	}
	var b strings.Builder
	for i, blk := range strings.Split(strings.TrimSuffix(out, "\n"), "\n\n") {
		if i < len(comments) && comments[i] != "" {
			b.WriteString(comments[i] + "\n")
		}
		b.WriteString(blk + "\n\n")
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// formatArgs prints a command's arguments in the order written.
func formatArgs(c scenarioCase) string {
	var b strings.Builder
	for _, k := range c.keys {
		if v := c.args[k]; v == "" {
			b.WriteString(" " + k)
		} else {
			b.WriteString(" " + k + "=" + v)
		}
	}
	return b.String()
}

func (sc *scenario) fatalf(c scenarioCase, format string, args ...any) {
	sc.t.Helper()
	sc.t.Fatalf("line %d: %s: %s", c.line, c.cmd, fmt.Sprintf(format, args...))
}

func (sc *scenario) int(c scenarioCase, key string, def int64) int64 {
	v, ok := c.args[key]
	if !ok {
		return def
	}
	mult := int64(1)
	switch {
	case strings.HasSuffix(v, "K"):
		mult, v = 1<<10, strings.TrimSuffix(v, "K")
	case strings.HasSuffix(v, "M"):
		mult, v = 1<<20, strings.TrimSuffix(v, "M")
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		sc.fatalf(c, "%s=%q: %v", key, c.args[key], err)
	}
	return n * mult
}

func (sc *scenario) dur(c scenarioCase, key string, def time.Duration) time.Duration {
	v, ok := c.args[key]
	if !ok {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		sc.fatalf(c, "%s=%q: %v", key, v, err)
	}
	return d
}

func (sc *scenario) id(c scenarioCase) string {
	id := c.args["id"]
	if id == "" {
		sc.fatalf(c, "no id=")
	}
	return id
}

// readiness is what a change of prints.
func (sc *scenario) readiness() string {
	if sc.c.Dispatching() {
		return "ready"
	}
	_, why, cannot := sc.c.NotReady()
	s := "not-ready: " + why
	if cannot {
		s += " [cannot place]"
	}
	return s
}

// do runs one command and returns what it printed.
func (sc *scenario) do(c scenarioCase) string {
	if c.cmd != "config" && sc.c == nil {
		sc.fatalf(c, "before config")
	}
	var acts []Action
	tick := true
	before := ""
	if sc.c != nil {
		before = sc.readiness()
	}
	switch c.cmd {
	case "config":
		layers := int(sc.int(c, "layers", 4))
		shape := Shape{Model: "feedface", Layers: layers, LayerBytes: make([]int64, layers),
			EmbedBytes: 500, HeadBytes: 500, KVBytesPerBlockLayer: 100, BlockSize: 16}
		for i := range shape.LayerBytes {
			shape.LayerBytes[i] = 1000
		}
		sc.cfg = Config{Shape: shape, MinShards: int(sc.int(c, "min", 1)), KVMemory: sc.int(c, "kv", 0),
			Mix: Mix(c.args["mix"]), LossConfirm: sc.dur(c, "confirm", 10*time.Second), Epoch: 7, Start: t0}
		core, err := New(sc.cfg)
		if err != nil {
			sc.fatalf(c, "%v", err)
		}
		sc.c, sc.now, sc.ids, sc.formed, sc.reported = core, t0, nil, false, nil
		return sc.readiness() + "\n"
	case "register":
		id := sc.id(c)
		node := c.args["node"]
		if node == "" {
			node = id
		}
		info := ShardInfo{ID: id, NodeID: node, Incarnation: uint64(sc.int(c, "inc", 1)), Addr: id + ":7070",
			Memory: sc.int(c, "mem", 0), KVMemory: sc.int(c, "kvmem", 0), Registered: sc.now}
		if d := sc.dur(c, "speed", 0); d > 0 {
			info.Speed = &Speed{Layers: sc.cfg.Shape.Layers, Decode1: d, Decode8: 2 * d, Prefill: 20 * d, PrefillTokens: 64}
		}
		// As the coordinator does: another process of the node is lost.
		for _, old := range sc.ids {
			if s, ok := sc.c.Shard(old); ok && s.NodeID == node && old != id {
				acts = append(acts, sc.c.Forget(old, "new incarnation registered", sc.now)...)
				sc.drop(old)
			}
		}
		if _, ok := sc.c.Shard(id); !ok {
			sc.ids = append(sc.ids, id)
		}
		acts = append(acts, sc.c.Register(info, sc.now)...)
	case "up":
		acts = sc.c.StreamUp(sc.id(c), sc.now)
	case "down":
		err := errors.New("EOF")
		if e := c.args["err"]; e != "" {
			err = errors.New(e)
		}
		acts = sc.c.StreamDown(sc.id(c), err, sc.now)
	case "heartbeat":
		acts = sc.c.Heartbeat(sc.id(c), sc.now)
	case "measured":
		acts = sc.c.StageTime(sc.id(c), sc.dur(c, "mean", 0))
	case "busy":
		acts = sc.c.Progress(sc.now, int(sc.int(c, "tokens", 0)), sc.now)
	case "idle":
		acts = sc.c.Progress(time.Time{}, 0, sc.now)
	case "deadline":
		tick = false
		return sc.c.ProgressDeadline().String() + "\n"
	case "loaded", "failed":
		v := uint64(0)
		if p := sc.c.Active(); p != nil {
			v = p.Version
		}
		v = uint64(sc.int(c, "v", int64(v)))
		if c.cmd == "loaded" {
			if sc.reported == nil {
				sc.reported = map[string]map[uint64]bool{}
			}
			if sc.reported[sc.id(c)] == nil {
				sc.reported[sc.id(c)] = map[uint64]bool{}
			}
			sc.reported[sc.id(c)][v] = true
			acts = sc.c.Loaded(sc.id(c), v, sc.now)
		} else {
			acts = sc.c.LoadFailed(sc.id(c), v, c.args["why"], sc.now)
		}
	case "member":
		kinds := map[string]MemberKind{"alive": MemberAlive, "suspect": MemberSuspect, "dead": MemberDead, "leave": MemberLeft}
		k, ok := kinds[c.args["kind"]]
		if !ok {
			sc.fatalf(c, "kind=%q", c.args["kind"])
		}
		acts = sc.c.Member(c.args["node"], uint64(sc.int(c, "inc", 1)), k, sc.now)
	case "link":
		p := sc.c.Active()
		if p == nil {
			sc.fatalf(c, "no placement")
		}
		switch {
		case c.args["up"] == "" && hasKey(c, "up"):
			acts = sc.c.LinkUp(p.Version, sc.now)
		case hasKey(c, "down"):
			err := errors.New("connection refused")
			if e := c.args["err"]; e != "" {
				err = errors.New(e)
			}
			acts = sc.c.LinkDown(p.Stages[0].ShardID, err, sc.now)
		default:
			sc.fatalf(c, "link up or link down")
		}
	case "downstream":
		p := sc.c.Active()
		if p == nil {
			sc.fatalf(c, "no placement")
		}
		acts = sc.c.Downstream(p.Version, c.args["shard"], "downstream_unavailable", sc.now)
	case "forget":
		acts = sc.c.Forget(sc.id(c), "", sc.now)
		sc.drop(sc.id(c))
	case "advance":
		sc.now = sc.now.Add(sc.dur(c, "d", 0))
	case "tick":
	case "show":
		tick = false
	default:
		sc.fatalf(c, "unknown command")
	}
	if tick {
		acts = append(acts, sc.c.Tick(sc.now)...)
	}
	sc.check(c, acts)
	var b strings.Builder
	for _, a := range acts {
		b.WriteString(printAction(a) + "\n")
	}
	if after := sc.readiness(); after != before {
		b.WriteString(after + "\n")
	}
	if c.cmd == "show" {
		b.WriteString(sc.show())
	}
	return b.String()
}

func hasKey(c scenarioCase, k string) bool {
	_, ok := c.args[k]
	return ok
}

func (sc *scenario) drop(id string) {
	for i, x := range sc.ids {
		if x == id {
			sc.ids = append(sc.ids[:i], sc.ids[i+1:]...)
			return
		}
	}
}

// check runs the core's invariants and the script's: a placement is made
// only of connected shards that are not lost, and the first only with
// --min-shards of them.
func (sc *scenario) check(c scenarioCase, acts []Action) {
	sc.t.Helper()
	if err := sc.c.CheckInvariants(); err != nil {
		sc.fatalf(c, "invariant: %v", err)
	}
	// Make before break: a re-plan pauses nothing while its placement
	// loads, and a placement activated without Assigns (the switch to a
	// make-before-break one) has every stage READY for it already.
	for i, a := range acts {
		switch a.Kind {
		case ActReplan:
			if slices.ContainsFunc(acts, func(b Action) bool { return b.Kind == ActPause }) {
				sc.fatalf(c, "a re-plan paused the pipeline before its placement loaded: %v", acts)
			}
		case ActActivate:
			if slices.ContainsFunc(acts[i:], func(b Action) bool { return b.Kind == ActAssign && b.Placement == a.Placement }) {
				continue
			}
			for _, st := range a.Placement.Stages {
				if !sc.reported[st.ShardID][a.Placement.Version] {
					sc.fatalf(c, "placement %d switched to before shard %s was READY for it", a.Placement.Version, st.ShardID)
				}
			}
		}
	}
	for _, a := range acts {
		if a.Kind != ActActivate {
			continue
		}
		for _, st := range a.Placement.Stages {
			s, ok := sc.c.Shard(st.ShardID)
			if !ok || s.Lost || !s.Connected || s.Failed != "" {
				sc.fatalf(c, "placement %d holds shard %s: %+v", a.Placement.Version, st.ShardID, s)
			}
		}
		if !sc.formed {
			n := 0
			for _, id := range sc.ids {
				if s, _ := sc.c.Shard(id); s.Connected && !s.Lost && s.Failed == "" {
					n++
				}
			}
			if n < sc.cfg.MinShards {
				sc.fatalf(c, "first placement with %d candidates, --min-shards %d", n, sc.cfg.MinShards)
			}
		}
		sc.formed = true
	}
}

func stageRanges(p *Placement) string {
	var parts []string
	for _, st := range p.Stages {
		parts = append(parts, fmt.Sprintf("%s[%d,%d)", st.ShardID, st.First, st.End))
	}
	return strings.Join(parts, " ")
}

// printAction prints one action on a line.
func printAction(a Action) string {
	switch a.Kind {
	case ActPause:
		return "pause: " + a.Reason
	case ActActivate:
		return fmt.Sprintf("activate v%d: %s blocks=%d", a.Placement.Version, stageRanges(a.Placement), a.Placement.Blocks)
	case ActAssign:
		st := a.Placement.Stages[a.Stage]
		return fmt.Sprintf("assign %s: v%d stage %d [%d,%d)", a.Shard, a.Placement.Version, a.Stage, st.First, st.End)
	case ActSpare:
		return fmt.Sprintf("spare %s: v%d", a.Shard, a.Placement.Version)
	case ActOpenLink:
		return fmt.Sprintf("open-link v%d: %s", a.Placement.Version, a.Shard)
	case ActResume:
		return fmt.Sprintf("resume v%d", a.Placement.Version)
	case ActLost:
		return fmt.Sprintf("lost %s: %s", a.Shard, a.Reason)
	case ActCut:
		return "cut " + a.Shard
	case ActOverruled:
		return fmt.Sprintf("overruled %s: %s", a.Shard, a.Reason)
	case ActLoaded:
		return fmt.Sprintf("loaded %s: v%d", a.Shard, a.Placement.Version)
	case ActLoadFailed:
		return fmt.Sprintf("load-failed %s: v%d: %s", a.Shard, a.Placement.Version, a.Reason)
	case ActReplan:
		return fmt.Sprintf("replan v%d: %s (%s)", a.Placement.Version, stageRanges(a.Placement), a.Reason)
	case ActAbandon:
		return fmt.Sprintf("abandon v%d: %s", a.Placement.Version, a.Reason)
	case ActWarn:
		return "warn: " + a.Reason
	}
	return a.Kind.String()
}

// show prints the active placement and every shard's state.
func (sc *scenario) show() string {
	var b strings.Builder
	if p := sc.c.Active(); p != nil {
		fmt.Fprintf(&b, "placement v%d: %s\n", p.Version, stageRanges(p))
	} else {
		b.WriteString("no placement\n")
	}
	if p := sc.c.Next(); p != nil {
		fmt.Fprintf(&b, "next v%d: %s\n", p.Version, stageRanges(p))
	}
	for _, id := range sc.ids {
		s, _ := sc.c.Shard(id)
		var st []string
		if s.Connected {
			st = append(st, "connected")
		} else {
			st = append(st, "disconnected")
		}
		if s.Lost {
			st = append(st, "lost")
		}
		if s.Failed != "" {
			st = append(st, "failed")
		}
		if s.Ready > 0 {
			st = append(st, fmt.Sprintf("ready=v%d", s.Ready))
		}
		if s.Staged > 0 {
			st = append(st, fmt.Sprintf("staged=v%d", s.Staged))
		}
		fmt.Fprintf(&b, "%s: %s\n", id, strings.Join(st, " "))
	}
	if why := sc.c.ReplanSkipped(); why != "" {
		fmt.Fprintf(&b, "replan skipped: %s\n", why)
	}
	fmt.Fprintf(&b, "overruled=%d\n", sc.c.Overruled())
	return b.String()
}
