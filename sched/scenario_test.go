package sched

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/strata-llm/strata/kv"
)

// rewrite regenerates the expected output of testdata/scenarios/*.txt from
// what the scheduler does now. Read the diff before committing it: the files
// are the batching policy's specification.
var rewrite = flag.Bool("rewrite", false, "rewrite testdata/scenarios with the scheduler's current output")

// TestScenarios plays the scripts of testdata/scenarios event by event,
// checking the scheduler's invariants after every event and comparing what
// each event printed (a Step's batches row by row, its tombstones and its
// updates) with the script. The format is datadriven's:
//
//	# a comment
//	command key=value ...
//	----
//	expected output, up to a blank line
//
// Commands:
//
//	config [tokens=N] [rows=N] [stages=N] [inflight=N] [blocks=N] [bs=N]
//	       [watermark=N] [len=N] [prefix]   a new scheduler (defaults: testConfig)
//	add req=ID prompt=N max=N               Add; prints an error, if any
//	step                                    Step; prints its Output
//	complete batch=ID [tok=T] [skip=SEQ]    answer a batch, sampling T (9) for
//	                                        every row that asks but SEQ
//	fail batch=ID                           the whole batch was lost
//	abort req=ID                            Abort(ID, Aborted)
//	advance d=DURATION                      move the clock
//	stats                                   waiting, running, in flight, blocks used
//
// A row prints as "r<request> s<seq> <pos>+<tokens> [first] [sample]
// blocks=<n>", in the order of the batch.
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
	s      *Scheduler
	now    time.Time
	sent   map[BatchID]Batch // dispatched and not yet answered by the script
	tombed map[SeqID]bool
}

// scenarioCase is one command of a script and what it must print.
type scenarioCase struct {
	line     int
	cmd      string
	args     map[string]string
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
			fmt.Fprintf(&out, "%s\n----\n%s\n", c.cmd+formatArgs(c.args), got)
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
		}
		i++
		if i >= len(lines) || lines[i] != "----" {
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

// keepComments rewrites a script: the comment paragraphs of old stay where
// they were, before the command that followed them, and the commands with
// their outputs come from out.
func keepComments(old, out string) string {
	var comments []string // comment block before each command, in order
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
	blocks := strings.Split(strings.TrimSuffix(out, "\n"), "\n\n")
	for i, blk := range blocks {
		if i < len(comments) && comments[i] != "" {
			b.WriteString(comments[i] + "\n")
		}
		b.WriteString(blk + "\n\n")
	}
	return strings.TrimSuffix(b.String(), "\n")
}

func formatArgs(args map[string]string) string {
	var b strings.Builder
	for _, k := range []string{"req", "batch", "prompt", "max", "tok", "skip", "d", "tokens", "rows", "stages", "inflight", "blocks", "bs", "watermark", "len", "prefix"} {
		v, ok := args[k]
		switch {
		case !ok:
		case v == "":
			b.WriteString(" " + k)
		default:
			b.WriteString(" " + k + "=" + v)
		}
	}
	return b.String()
}

func (sc *scenario) int(c scenarioCase, key string, def int) int {
	v, ok := c.args[key]
	if !ok {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		sc.t.Fatalf("line %d: %s=%q: %v", c.line, key, v, err)
	}
	return n
}

// do runs one command and returns what it printed.
func (sc *scenario) do(c scenarioCase) string {
	t := sc.t
	if c.cmd != "config" && sc.s == nil {
		t.Fatalf("line %d: %s before config", c.line, c.cmd)
	}
	var out string
	switch c.cmd {
	case "config":
		cfg := testConfig()
		cfg.MaxBatchTokens = sc.int(c, "tokens", cfg.MaxBatchTokens)
		cfg.MaxBatchRows = sc.int(c, "rows", cfg.MaxBatchRows)
		cfg.Stages = sc.int(c, "stages", cfg.Stages)
		cfg.MaxInFlight = sc.int(c, "inflight", cfg.MaxInFlight)
		cfg.KV = kv.Config{Blocks: sc.int(c, "blocks", cfg.KV.Blocks), BlockSize: sc.int(c, "bs", cfg.KV.BlockSize)}
		_, cfg.KV.PrefixCaching = c.args["prefix"]
		cfg.WatermarkBlocks = sc.int(c, "watermark", cfg.WatermarkBlocks)
		cfg.MaxModelLen = sc.int(c, "len", cfg.MaxModelLen)
		s, err := New(cfg)
		if err != nil {
			t.Fatalf("line %d: %v", c.line, err)
		}
		sc.s, sc.now, sc.sent, sc.tombed = s, t0, map[BatchID]Batch{}, map[SeqID]bool{}
	case "add":
		id := RequestID(sc.int(c, "req", 0))
		p := make([]int32, sc.int(c, "prompt", 1))
		for i := range p {
			p[i] = int32(100*int(id) + i + 1)
		}
		if err := sc.s.Add(Request{ID: id, Prompt: p, MaxTokens: sc.int(c, "max", 1), Stop: []int32{0}, Arrival: sc.now}); err != nil {
			out = fmt.Sprintf("error: %v\n", err)
		}
	case "step":
		out = sc.step()
	case "complete":
		id := BatchID(sc.int(c, "batch", 0))
		b, ok := sc.sent[id]
		if !ok {
			t.Fatalf("line %d: batch %d is not in flight", c.line, id)
		}
		delete(sc.sent, id)
		tok, skip := int32(sc.int(c, "tok", 9)), SeqID(sc.int(c, "skip", 0))
		res := Result{Batch: id}
		for _, r := range b.Rows {
			if r.Sample && r.Seq != skip {
				res.Samples = append(res.Samples, Sample{Seq: r.Seq, Token: tok})
			}
		}
		sc.s.Complete(res, sc.now)
	case "fail":
		id := BatchID(sc.int(c, "batch", 0))
		delete(sc.sent, id)
		sc.s.BatchFailed(Failure{Batch: id})
	case "abort":
		if err := sc.s.Abort(RequestID(sc.int(c, "req", 0)), Aborted); err != nil {
			t.Fatalf("line %d: %v", c.line, err)
		}
	case "advance":
		d, err := time.ParseDuration(c.args["d"])
		if err != nil {
			t.Fatalf("line %d: %v", c.line, err)
		}
		sc.now = sc.now.Add(d)
	case "stats":
		st := sc.s.Stats()
		out = fmt.Sprintf("waiting=%d running=%d inflight=%d blocks=%d\n", st.Waiting, st.Running, st.InFlight, st.KV.Used)
	default:
		t.Fatalf("line %d: unknown command %q", c.line, c.cmd)
	}
	if err := sc.s.CheckInvariants(); err != nil {
		t.Fatalf("line %d: after %s: %v", c.line, c.cmd, err)
	}
	return out
}

// step runs Step and prints its Output: batches row by row, then
// tombstones, then updates.
func (sc *scenario) step() string {
	out := sc.s.Step(sc.now)
	var b strings.Builder
	for _, bt := range out.Batches {
		sc.sent[bt.ID] = bt
		fmt.Fprintf(&b, "batch %d\n", bt.ID)
		for _, r := range bt.Rows {
			fmt.Fprintf(&b, "  r%d s%d %d+%d", r.Request, r.Seq, r.Pos, len(r.Tokens))
			if r.First {
				b.WriteString(" first")
			}
			if r.Sample {
				b.WriteString(" sample")
			}
			fmt.Fprintf(&b, " blocks=%d\n", len(r.Blocks))
			for i, tok := range r.Tokens {
				if want := sc.s.reqs[r.Request].tokens[r.Pos+i]; tok != want {
					sc.t.Fatalf("batch %d: request %d token %d is %d, want %d", bt.ID, r.Request, r.Pos+i, tok, want)
				}
			}
		}
	}
	for _, tb := range out.Tombstones {
		if sc.tombed[tb.Seq] {
			sc.t.Fatalf("sequence %d tombstoned twice", tb.Seq)
		}
		sc.tombed[tb.Seq] = true
		fmt.Fprintf(&b, "tombstone s%d %v\n", tb.Seq, tb.Reason)
	}
	for _, u := range out.Updates {
		fmt.Fprintf(&b, "update r%d %v", u.Request, u.Tokens)
		if u.Done {
			fmt.Fprintf(&b, " done %v", u.Reason)
		}
		b.WriteString("\n")
	}
	if b.Len() == 0 {
		return "nothing\n"
	}
	return b.String()
}
