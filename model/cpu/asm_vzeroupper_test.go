package cpu_test

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// This file checks the assembly rule of STYLE.md and DESIGN.md: every
// assembly function that touches a YMM or ZMM register executes VZEROUPPER
// right before it leaves. A function that returns with the upper halves
// dirty makes every legacy-SSE instruction run later on the same thread (all
// of Go's scalar float code) pay the AVX→SSE transition penalty on Intel
// CPUs; it made serving 6× slower on a Xeon, while AMD hides it. The checker
// reads Go assembly text only, so it runs on every GOARCH.

// TestVZEROUPPER checks every .s file of the repository.
func TestVZEROUPPER(t *testing.T) {
	root := repoRoot(t)
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && (d.Name() == "vendor" || d.Name() == ".git") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(d.Name(), ".s") {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// A broken walk must not pass by checking nothing: the kernels of this
	// package are among the files.
	own, err := filepath.Abs("kernels_amd64.s")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(files, own) {
		t.Fatalf("walk of %s found %d .s files, not %s", root, len(files), own)
	}
	for _, path := range files {
		src, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			t.Fatal(err)
		}
		funcs := parseAsm(string(src))
		vector := 0
		for _, f := range funcs {
			if f.usesYZ() {
				vector++
			}
			for _, e := range f.missingVZEROUPPER() {
				in := f.insts[e]
				t.Errorf("%s:%d: function %s uses YMM/ZMM registers but its %s is not immediately preceded by VZEROUPPER",
					rel, in.line, f.name, strings.TrimSpace(in.op+" "+in.args))
			}
		}
		t.Logf("%s: %d functions, %d use YMM/ZMM registers", rel, len(funcs), vector)
	}
}

// TestVZEROUPPERChecker proves that the checker above can fail: each case is
// a small assembly file and the findings it must produce.
func TestVZEROUPPERChecker(t *testing.T) {
	for _, tc := range []struct {
		name string
		src  string
		want []string // "line: function" of every exit missing VZEROUPPER
	}{{
		name: "clean",
		src: `#include "textflag.h"

// func add(n int, x *float32)
TEXT ·add(SB), NOSPLIT, $0-16
	MOVQ n+0(FP), AX
	VXORPS Y0, Y0, Y0
loop:
	VADDPS (SI), Y0, Y0
	DECQ AX
	JNZ loop
	VZEROUPPER
	RET
`,
	}, {
		name: "bare RET after Y register",
		src: `TEXT ·add(SB), NOSPLIT, $0-16
	VADDPS Y1, Y2, Y3
	RET
`,
		want: []string{"3: ·add"},
	}, {
		name: "two RETs, one clean",
		src: `TEXT ·f(SB), NOSPLIT, $0-8
	VPXORQ Z0, Z0, Z0
	TESTQ AX, AX
	JZ empty
	VZEROUPPER
	RET
empty:
	RET
TEXT ·g(SB), NOSPLIT, $0-8
	VZEROUPPER; RET
`,
		want: []string{"8: ·f"},
	}, {
		name: "X registers only",
		src: `TEXT ·scalar(SB), NOSPLIT, $0-8
	VMOVSS (AX), X0
	VADDSS X1, X0, X0
	VFMADD231PS X16, X17, X18
	RET
`,
	}, {
		name: "K masks, labels and symbols named like registers",
		src: `DATA Y1<>+0(SB)/4, $1
GLOBL Y1<>(SB), RODATA, $4
TEXT ·masks(SB), NOSPLIT, $0-8
	KMOVW K1, AX // Y0 in a comment
	/* Z3 in a block
	   comment */ MOVQ $Y1<>(SB), BX
	MOVQ ·Z2(SB), CX
	MOVQ Y1<>+0(SB), DX
Y5:
	JMP Y5
	RET
`,
	}, {
		name: "label between VZEROUPPER and RET",
		src: `TEXT ·f(SB), NOSPLIT, $0-8
	VMOVDQU Y0, (AX)
	VZEROUPPER
done:
	RET
`,
		want: []string{"5: ·f"},
	}, {
		name: "tail call",
		src: `TEXT ·f(SB), NOSPLIT, $0-8
	VMOVDQU (AX)(Y2*4), Y0
	JMP ·g(SB)
TEXT ·h(SB), NOSPLIT, $0-8
	VMOVDQU Z0, (AX)
	VZEROUPPER
	JMP ·g(SB)
`,
		want: []string{"3: ·f"},
	}, {
		name: "VZEROUPPER not last",
		src: `TEXT ·f(SB), NOSPLIT, $0-8
	VZEROUPPER
	VMOVDQU Y0, (AX)
	RET
`,
		want: []string{"4: ·f"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, f := range parseAsm(tc.src) {
				for _, e := range f.missingVZEROUPPER() {
					got = append(got, fmt.Sprintf("%d: %s", f.insts[e].line, f.name))
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("findings %q, want %q", got, tc.want)
			}
		})
	}
}

// repoRoot walks up from the working directory to the directory of go.mod.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		_, err := os.Stat(filepath.Join(dir, "go.mod"))
		if err == nil {
			return dir
		}
		if !errors.Is(err, fs.ErrNotExist) {
			t.Fatal(err)
		}
		up := filepath.Dir(dir)
		if up == dir {
			t.Fatal("no go.mod above the working directory")
		}
		dir = up
	}
}

// asmFunc is one TEXT function of a Go assembly file: the statements from its
// TEXT directive to the next one or the end of the file.
type asmFunc struct {
	name  string
	line  int // of the TEXT directive
	insts []asmInst
}

// asmInst is one statement of a function: an instruction, or a label (op "").
type asmInst struct {
	line int
	op   string // upper case
	args string
}

// yzReg matches an operand that names a YMM or ZMM register: Y0–Y31 or
// Z0–Z31 as a whole word, not preceded by $ or a symbol's package dot and not
// followed by what makes it a symbol ("(SB)", "<>", an offset).
var yzReg = regexp.MustCompile(`(^|[^\w·.$∕])[YZ]([12]?[0-9]|3[01])\s*($|[,)*])`)

// missingVZEROUPPER returns the indexes in f.insts of every exit of f that may
// leave the upper halves of YMM/ZMM registers dirty: none when f names no
// such register, else every exit not right after a VZEROUPPER.
func (f *asmFunc) missingVZEROUPPER() []int {
	if !f.usesYZ() {
		return nil
	}
	var out []int
	for _, e := range f.exits() {
		if !f.cleanExit(e) {
			out = append(out, e)
		}
	}
	return out
}

// usesYZ reports whether an instruction of f names a YMM or ZMM register.
// Branch targets are labels or symbols, never registers, and are skipped.
func (f *asmFunc) usesYZ() bool {
	for _, in := range f.insts {
		if in.op == "" || isBranch(in.op) {
			continue
		}
		for arg := range strings.SplitSeq(in.args, ",") {
			if yzReg.MatchString(strings.TrimSpace(arg)) {
				return true
			}
		}
	}
	return false
}

// exits returns the indexes of the statements of f that leave it: RET, and
// jumps to a symbol or through a register or memory (tail calls).
func (f *asmFunc) exits() []int {
	var out []int
	for i, in := range f.insts {
		switch {
		case in.op == "RET":
			out = append(out, i)
		case strings.HasPrefix(in.op, "J"):
			target := strings.TrimSpace(in.args)
			// "label" and "2(PC)" stay inside; "sym(SB)", "AX", "(AX)" leave.
			if strings.Contains(target, "(SB)") || isGPR(target) ||
				strings.Contains(target, "(") && !strings.HasSuffix(target, "(PC)") {
				out = append(out, i)
			}
		}
	}
	return out
}

// cleanExit reports whether the statement right before exit i is VZEROUPPER.
// A label in between fails: a jump to it would skip the VZEROUPPER.
func (f *asmFunc) cleanExit(i int) bool {
	return i > 0 && f.insts[i-1].op == "VZEROUPPER"
}

func isBranch(op string) bool {
	return strings.HasPrefix(op, "J") || op == "CALL" || strings.HasPrefix(op, "LOOP")
}

// gpr matches the names of the general-purpose registers, the targets of
// indirect jumps.
var gpr = regexp.MustCompile(`^([ABCD]X|[SD]I|[BS]P|R([89]|1[0-5]))$`)

func isGPR(s string) bool { return gpr.MatchString(s) }

// parseAsm splits Go assembly source into its TEXT functions. It drops
// comments and preprocessor lines, splits statements at ";", and keeps
// labels as statements of their own. Directives that emit no code in the
// function (DATA, GLOBL, PCDATA, FUNCDATA) are dropped; statements before the
// first TEXT belong to no function.
func parseAsm(src string) []*asmFunc {
	var funcs []*asmFunc
	var cur *asmFunc
	inBlock, inMacro := false, false
	for n, line := range strings.Split(src, "\n") {
		lineNo := n + 1
		var code string
		code, inBlock = stripComments(line, inBlock)
		trimmed := strings.TrimSpace(code)
		if inMacro || strings.HasPrefix(trimmed, "#") {
			inMacro = strings.HasSuffix(trimmed, `\`)
			continue
		}
		for _, stmt := range splitStatements(code) {
			stmt = strings.TrimSpace(stmt)
			for {
				// A leading "name:" is a label.
				i := strings.IndexByte(stmt, ':')
				if i <= 0 || !isIdent(stmt[:i]) {
					break
				}
				if cur != nil {
					cur.insts = append(cur.insts, asmInst{line: lineNo})
				}
				stmt = strings.TrimSpace(stmt[i+1:])
			}
			if stmt == "" {
				continue
			}
			op, args := stmt, ""
			if j := strings.IndexAny(stmt, " \t"); j >= 0 {
				op, args = stmt[:j], strings.TrimSpace(stmt[j+1:])
			}
			op = strings.ToUpper(op)
			switch op {
			case "TEXT":
				name, _, _ := strings.Cut(args, "(")
				cur = &asmFunc{name: strings.TrimSpace(name), line: lineNo}
				funcs = append(funcs, cur)
			case "DATA", "GLOBL", "PCDATA", "FUNCDATA":
			default:
				if cur != nil {
					cur.insts = append(cur.insts, asmInst{line: lineNo, op: op, args: args})
				}
			}
		}
	}
	return funcs
}

// stripComments removes // and /* */ comments from one line, outside quoted
// strings and character constants; inBlock says whether the line starts inside
// a block comment, and the result whether the next one does.
func stripComments(line string, inBlock bool) (string, bool) {
	var b strings.Builder
	var quote byte
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case inBlock:
			if strings.HasPrefix(line[i:], "*/") {
				inBlock = false
				i++
			}
		case quote != 0:
			b.WriteByte(c)
			if c == '\\' && i+1 < len(line) {
				i++
				b.WriteByte(line[i])
			} else if c == quote {
				quote = 0
			}
		case c == '"' || c == '\'':
			quote = c
			b.WriteByte(c)
		case strings.HasPrefix(line[i:], "//"):
			return b.String(), false
		case strings.HasPrefix(line[i:], "/*"):
			inBlock = true
			b.WriteByte(' ')
			i++
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), inBlock
}

// splitStatements splits a line at the semicolons outside quotes.
func splitStatements(code string) []string {
	var out []string
	var quote byte
	start := 0
	for i := 0; i < len(code); i++ {
		switch c := code[i]; {
		case quote != 0:
			if c == '\\' {
				i++
			} else if c == quote {
				quote = 0
			}
		case c == '"' || c == '\'':
			quote = c
		case c == ';':
			out = append(out, code[start:i])
			start = i + 1
		}
	}
	return append(out, code[start:])
}

var identRE = regexp.MustCompile(`^[\p{L}_·][\p{L}\p{N}_·]*$`)

func isIdent(s string) bool { return identRE.MatchString(s) }
