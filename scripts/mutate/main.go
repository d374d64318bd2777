// Command mutate proves the safety rules' tests: it applies each mutation
// of the catalogue (catalogue.go) — a small, plausible bug in the code that
// keeps a sequence's KV from outliving it — one at a time, runs the tests of
// only the packages that should catch it, and fails if any mutation
// survives, if a mutation's snippet is not found exactly once, or if a
// mutated tree does not build.
//
//	go run ./scripts/mutate            # every mutation, GOMAXPROCS at a time
//	go run ./scripts/mutate -run table # the mutations whose name matches
//	go run ./scripts/mutate -list      # the catalogue
//
// The working tree is never written. The files git sees (tracked and
// untracked, not ignored) are copied once to a temporary directory, beside a
// link to ../shared when it exists (tests that read the shared model files
// find them there as they do here), so that edits made while mutate runs
// change nothing. Each mutation's copy of its file is written beside the
// tree and swapped in by `go test -overlay`: mutations run side by side in
// the one copy and there is nothing to restore. (One copy per worker,
// mutated in place, would compile the repository's packages once per copy:
// the build cache keys them by directory.) Tests run with -short, -count=1
// and -vet=off (a mutation's also with -failfast: its first failing test
// kills it): the mutations are judged by the tests alone. Before any
// mutation, every package and filter of the catalogue must pass unmutated:
// otherwise a failing test would count as a kill.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
)

// mutation is one deliberate bug.
type mutation struct {
	Name string   // unique, area/what
	File string   // slash-separated, relative to the repository root
	Orig string   // must occur exactly once in File
	Repl string   // what Orig becomes
	Pkgs []string // packages whose tests must catch it ("./kv")
	Run  string   // a -run regexp, when it keeps the run fast; "" runs every test
	Why  string   // the plausible bug, in one line

	overlay string // the -overlay file that swaps the mutated File in
}

// job is one `go test` run: a mutation, or a baseline (m == nil).
type job struct {
	m    *mutation
	pkgs []string
	run  string
}

// outcome is what a job's run showed.
type outcome struct {
	job    job
	passed bool
	broken bool     // the tree did not build
	failed []string // the tests that failed
	out    []byte
	took   time.Duration
}

func main() { os.Exit(run()) }

// run is main, returning the exit status: 0 when every mutation was killed,
// 1 when one survived or broke the build or the catalogue is stale, 2 when
// mutate itself could not work.
func run() int {
	var (
		jobs    = flag.Int("j", runtime.GOMAXPROCS(0), "mutations tested at once")
		only    = flag.String("run", "", "run only the mutations whose name matches this regexp")
		list    = flag.Bool("list", false, "print the catalogue and exit")
		verbose = flag.Bool("v", false, "print each killed mutation's failures")
		timeout = flag.Duration("timeout", 2*time.Minute, "go test -timeout for one run")
	)
	flag.Parse()
	log := func(format string, args ...any) { fmt.Fprintf(os.Stderr, "mutate: "+format+"\n", args...) }

	root, err := gitRoot()
	if err != nil {
		log("%v", err)
		return 2
	}
	muts, err := selectMutations(catalogue, *only)
	if err != nil {
		log("%v", err)
		return 2
	}
	if *list {
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		for _, m := range muts {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", m.Name, m.File, m.Why)
		}
		tw.Flush()
		return 0
	}
	start := time.Now()
	if err := checkSnippets(root, muts); err != nil {
		log("%v", err)
		return 1
	}
	files, err := gitFiles(root)
	if err != nil {
		log("%v", err)
		return 2
	}
	tmp, err := os.MkdirTemp("", "strata-mutate-")
	if err != nil {
		log("%v", err)
		return 2
	}
	defer os.RemoveAll(tmp)
	tree, err := copyTree(root, files, tmp)
	if err == nil {
		err = writeOverlays(tree, tmp, muts)
	}
	if err != nil {
		log("%v", err)
		return 2
	}

	// Baseline: every (packages, filter) the mutations use must pass
	// unmutated. It also fills the build cache the mutations start from.
	var base []job
	seen := map[string]bool{}
	for _, m := range muts {
		k := strings.Join(m.Pkgs, " ") + "\x00" + m.Run
		if !seen[k] {
			seen[k] = true
			base = append(base, job{pkgs: m.Pkgs, run: m.Run})
		}
	}
	workers := max(1, *jobs)
	ctx := context.Background()
	bad := false
	for _, o := range runJobs(ctx, tree, workers, base, *timeout) {
		if !o.passed {
			bad = true
			log("baseline: %s -run %q does not pass unmutated (%v):\n%s", strings.Join(o.job.pkgs, " "), o.job.run, o.took.Round(time.Millisecond), tail(o.out, 40))
		}
	}
	if bad {
		return 1
	}
	log("%d mutations, %d at a time; %d files copied, baseline passed in %v", len(muts), workers, len(files), time.Since(start).Round(time.Millisecond))

	var mjobs []job
	for i := range muts {
		mjobs = append(mjobs, job{m: &muts[i], pkgs: muts[i].Pkgs, run: muts[i].Run})
	}
	outs := runJobs(ctx, tree, workers, mjobs, *timeout)

	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "MUTATION\tRESULT\tTIME\tCAUGHT BY\n")
	var survived, broken []string
	for _, o := range outs {
		res := "killed"
		switch {
		case o.broken:
			res = "BROKEN"
			broken = append(broken, o.job.m.Name)
		case o.passed:
			res = "SURVIVED"
			survived = append(survived, o.job.m.Name)
		}
		by := o.failed
		if len(by) > 4 {
			by = append(by[:4:4], fmt.Sprintf("(+%d more)", len(o.failed)-4))
		}
		fmt.Fprintf(tw, "%s\t%s\t%v\t%s\n", o.job.m.Name, res, o.took.Round(10*time.Millisecond), strings.Join(by, " "))
	}
	tw.Flush()
	for _, o := range outs {
		switch {
		case o.broken:
			log("%s does not build (fix its snippet or replacement):\n%s", o.job.m.Name, tail(o.out, 20))
		case o.passed:
			log("%s SURVIVED: %s (%s, tests of %s)", o.job.m.Name, o.job.m.Why, o.job.m.File, strings.Join(o.job.pkgs, " "))
		case *verbose:
			log("%s killed:\n%s", o.job.m.Name, tail(o.out, 30))
		}
	}
	log("%d mutations: %d killed, %d survived, %d broken, in %v",
		len(outs), len(outs)-len(survived)-len(broken), len(survived), len(broken), time.Since(start).Round(time.Second))
	if len(survived) > 0 || len(broken) > 0 {
		return 1
	}
	return 0
}

// selectMutations checks the catalogue's entries and returns those whose
// name matches only.
func selectMutations(all []mutation, only string) ([]mutation, error) {
	re, err := regexp.Compile(only)
	if err != nil {
		return nil, fmt.Errorf("-run: %w", err)
	}
	names := map[string]bool{}
	var out []mutation
	for _, m := range all {
		switch {
		case m.Name == "" || m.File == "" || m.Why == "" || len(m.Pkgs) == 0:
			return nil, fmt.Errorf("catalogue entry %q lacks a name, file, reason or package", m.Name)
		case names[m.Name]:
			return nil, fmt.Errorf("catalogue: two mutations named %s", m.Name)
		case m.Orig == "" || m.Orig == m.Repl:
			return nil, fmt.Errorf("catalogue: %s changes nothing", m.Name)
		}
		if m.Run != "" {
			if _, err := regexp.Compile(m.Run); err != nil {
				return nil, fmt.Errorf("catalogue: %s: -run: %w", m.Name, err)
			}
		}
		names[m.Name] = true
		if re.MatchString(m.Name) {
			out = append(out, m)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no mutation matches %q", only)
	}
	return out, nil
}

// checkSnippets verifies that every mutation's original snippet occurs
// exactly once in its file, so that the catalogue cannot rot silently.
func checkSnippets(root string, muts []mutation) error {
	var errs []error
	for _, m := range muts {
		src, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(m.File)))
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", m.Name, err))
			continue
		}
		if n := bytes.Count(src, []byte(m.Orig)); n != 1 {
			errs = append(errs, fmt.Errorf("%s: the original snippet occurs %d times in %s, want exactly once: update the catalogue with the code\n\t%q", m.Name, n, m.File, m.Orig))
		}
	}
	return errors.Join(errs...)
}

// writeOverlays writes, for each mutation, its mutated copy of the tree's
// file into dir and an overlay that swaps it in.
func writeOverlays(tree, dir string, muts []mutation) error {
	for i := range muts {
		m := &muts[i]
		path := filepath.Join(tree, filepath.FromSlash(m.File))
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if n := bytes.Count(src, []byte(m.Orig)); n != 1 {
			return fmt.Errorf("%s: the snippet occurs %d times in the copy of %s (edited while copying?)", m.Name, n, m.File)
		}
		mutated := filepath.Join(dir, fmt.Sprintf("%d-%s", i, filepath.Base(path)))
		if err := os.WriteFile(mutated, bytes.Replace(src, []byte(m.Orig), []byte(m.Repl), 1), 0o644); err != nil {
			return err
		}
		ov, err := json.Marshal(map[string]map[string]string{"Replace": {path: mutated}})
		if err != nil {
			return err
		}
		m.overlay = filepath.Join(dir, fmt.Sprintf("%d.json", i))
		if err := os.WriteFile(m.overlay, ov, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// runJobs runs jobs in tree, workers at a time, and returns the outcomes in
// the jobs' order.
func runJobs(ctx context.Context, tree string, workers int, jobs []job, timeout time.Duration) []outcome {
	outs := make([]outcome, len(jobs))
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(workers, len(jobs)) {
		wg.Go(func() {
			for i := range next {
				outs[i] = runJob(ctx, tree, jobs[i], timeout)
			}
		})
	}
	for i := range jobs {
		next <- i
	}
	close(next)
	wg.Wait()
	return outs
}

var (
	failLine  = regexp.MustCompile(`(?m)^\s*--- FAIL: (\S+)`)
	panicLine = regexp.MustCompile(`(?m)^(panic: .*|.*test timed out.*|FAIL\t.*)$`)
)

// runJob runs j's tests, with its mutation swapped in.
func runJob(ctx context.Context, tree string, j job, timeout time.Duration) outcome {
	o := outcome{job: j}
	args := []string{"test", "-short", "-count=1", "-vet=off", "-timeout", timeout.String()}
	if j.m != nil {
		// One failing test kills the mutation: the tests after it need
		// not run (CAUGHT BY then names the first catcher only).
		args = append(args, "-overlay", j.m.overlay, "-failfast")
	}
	if j.run != "" {
		args = append(args, "-run", j.run)
	}
	args = append(args, j.pkgs...)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = tree
	start := time.Now()
	o.out, _ = cmd.CombinedOutput()
	o.took = time.Since(start)
	o.passed = cmd.ProcessState != nil && cmd.ProcessState.Success()
	o.broken = !o.passed && (bytes.Contains(o.out, []byte("[build failed]")) || bytes.Contains(o.out, []byte("[setup failed]")))
	for _, f := range failLine.FindAllSubmatch(o.out, -1) {
		name := string(f[1])
		// A subtest's failure also fails its parent: name the leaf.
		o.failed = slices.DeleteFunc(o.failed, func(s string) bool { return strings.HasPrefix(name, s+"/") })
		if !slices.ContainsFunc(o.failed, func(s string) bool { return strings.HasPrefix(s, name+"/") }) {
			o.failed = append(o.failed, name)
		}
	}
	if !o.passed && !o.broken && len(o.failed) == 0 {
		o.failed = []string{"(" + why(o.out) + ")"} // a panic, a timeout
	}
	return o
}

// why names a failure without a failing test: its panic, timeout or FAIL
// line.
func why(b []byte) string {
	if m := panicLine.Find(b); m != nil {
		return strings.TrimSpace(string(m))
	}
	return "no test named"
}

// gitRoot is the top of the working tree mutate runs in.
func gitRoot() (string, error) {
	out, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		return "", fmt.Errorf("git rev-parse --show-toplevel: %w (run inside the repository)", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// gitFiles lists the working tree's files as git sees them: tracked and
// untracked, not ignored.
func gitFiles(root string) ([]string, error) {
	cmd := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("git ls-files: %w", err)
	}
	var files []string
	seen := map[string]bool{}
	for f := range strings.SplitSeq(string(out), "\x00") {
		if f != "" && !seen[f] {
			seen[f] = true
			files = append(files, f)
		}
	}
	return files, nil
}

// copyTree copies files from root into dir/main, links dir/shared to root's
// ../shared when that exists, and returns dir/main.
func copyTree(root string, files []string, dir string) (string, error) {
	dst := filepath.Join(dir, "main")
	for _, f := range files {
		from, to := filepath.Join(root, filepath.FromSlash(f)), filepath.Join(dst, filepath.FromSlash(f))
		st, err := os.Lstat(from)
		if errors.Is(err, os.ErrNotExist) {
			continue // deleted in the working tree
		}
		if err != nil {
			return "", err
		}
		if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
			return "", err
		}
		switch {
		case st.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink(from)
			if err == nil {
				err = os.Symlink(target, to)
			}
			if err != nil {
				return "", err
			}
		case st.Mode().IsRegular():
			if err := copyFile(from, to, st.Mode().Perm()); err != nil {
				return "", err
			}
		}
	}
	shared := filepath.Join(filepath.Dir(root), "shared")
	if st, err := os.Stat(shared); err == nil && st.IsDir() {
		if err := os.Symlink(shared, filepath.Join(dir, "shared")); err != nil {
			return "", err
		}
	}
	return dst, nil
}

func copyFile(from, to string, perm os.FileMode) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// tail returns the last n lines of b.
func tail(b []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
