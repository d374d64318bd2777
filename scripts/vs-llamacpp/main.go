// Command vs-llamacpp compares strata with llama.cpp on one GGUF file
// (issues 12 and 13): greedy tokens and the first token's top-10
// log-probabilities, beside llama.cpp's own spread between flash attention
// on and off.
//
//	vs-llamacpp compare --model FILE [--root DIR] [--server CMD] [--json OUT]
//	vs-llamacpp random --arch ARCH --out FILE [--head-scale K] [--size 110M|moe]
//	vs-llamacpp bench --model FILE --threads N
//
// compare starts llama-server twice on FILE (-fa on, then -fa off; -np 1,
// the file's context up to 2048, 2 threads), asks each for five prompts ×
// 64 greedy tokens (temperature 0, top_k 1 and the top_k sampler alone,
// repeat_penalty 1, cache_prompt false, ignore_eos, n_probs 20 on every
// position), then runs the same prompt tokens through strata's engine in
// this process (one stage of every layer on the CPU backend, F16 KV, as
// `coordinator generate` does; greedy = the largest logit, end-of-generation
// tokens skipped as ignore_eos skips them). It prints one Markdown table row
// and, with --json, appends the full record (every token and list) to OUT.
//
// A file's tokens agree when strata's 64 equal llama.cpp's (flash attention
// on, its default); where they part, the row gives the prompt, the position
// and the gap there between the two tokens on both sides, a "near tie"
// when both gaps are below --tie. The first token's log-probabilities pass
// issue 12's rule when, for every prompt, strata's largest difference from
// llama.cpp (on llama.cpp's top 10) is at most max(llama.cpp's own
// on/off difference on the same tokens, 2e-3).
//
// random writes a random-weight F32 model of an architecture with
// model.WriteRandomFile at a small shape with 256-multiple rows, then
// multiplies its output head by --head-scale (the token embedding where the
// head is tied) so the top token stands clear of the second. bench measures
// strata on a file as `coordinator generate --bench` does (pp128, tg64 and
// the end-to-end generate row) and prints one JSON line; the script
// scripts/bench-vs-llamacpp.sh alternates it with llama-bench.
//
// Nothing of llama.cpp is in this repository: the server is a separate
// program (scripts/llamacpp-chroot.sh installs Debian's build in a chroot).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
)

const usage = `usage: vs-llamacpp compare|random|bench|version [flags]  (-h after a command for its flags)`

// revision is the strata commit this binary was built from, as go build
// stamps it in a git checkout ("unknown" elsewhere), "+dirty" when the tree
// had changes.
func revision() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	rev, dirty := "unknown", ""
	for _, s := range info.Settings {
		switch {
		case s.Key == "vcs.revision" && len(s.Value) >= 7:
			rev = s.Value[:7]
		case s.Key == "vcs.modified" && s.Value == "true":
			dirty = "+dirty"
		}
	}
	return rev + dirty
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch os.Args[1] {
	case "compare":
		err = compare(ctx, os.Args[2:])
	case "random":
		err = random(os.Args[2:])
	case "bench":
		err = benchFile(ctx, os.Args[2:])
	case "version":
		fmt.Println(revision())
	default:
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "vs-llamacpp: %v\n", err)
		os.Exit(1)
	}
}
