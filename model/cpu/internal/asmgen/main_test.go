package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestNoBareRET checks that every function this generator emits ends through
// ret, which puts VZEROUPPER before RET: a call of RET anywhere but in ret
// fails. TestVZEROUPPER in package cpu checks the generated assembly itself.
func TestNoBareRET(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	sawRet := false
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, name, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, pos := range bareRETs(f) {
			t.Errorf("%s: RET called directly; end the function with ret() so that VZEROUPPER comes first", fset.Position(pos))
		}
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil && fd.Name.Name == "ret" {
				sawRet = true
				if got := calls(fd.Body); !slices.Equal(got, []string{"VZEROUPPER", "RET"}) {
					t.Errorf("%s: ret calls %q, want [VZEROUPPER RET]", fset.Position(fd.Pos()), got)
				}
			}
		}
	}
	if !sawRet {
		t.Error("no func ret in the generator")
	}
}

// TestBareRETsChecker proves that the check above can fail.
func TestBareRETsChecker(t *testing.T) {
	for _, tc := range []struct {
		src  string
		want int
	}{
		{"func ret() { VZEROUPPER(); RET() }\nfunc k() { VADDPS(a, b, c); ret() }", 0},
		{"func ret() { VZEROUPPER(); RET() }\nfunc k() { VADDPS(a, b, c); RET() }", 1},
		{"func k() { if x { build.RET() }; VZEROUPPER(); RET() }", 2},
	} {
		f, err := parser.ParseFile(token.NewFileSet(), "k.go", "package main\n"+tc.src, 0)
		if err != nil {
			t.Fatal(err)
		}
		if got := len(bareRETs(f)); got != tc.want {
			t.Errorf("%s: %d bare RETs, want %d", tc.src, got, tc.want)
		}
	}
}

// bareRETs returns the positions of the calls of RET (avo's build.RET, dot
// imported or not) outside func ret.
func bareRETs(f *ast.File) []token.Pos {
	var out []token.Pos
	for _, d := range f.Decls {
		if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil && fd.Name.Name == "ret" {
			continue
		}
		ast.Inspect(d, func(n ast.Node) bool {
			if c, ok := n.(*ast.CallExpr); ok && callName(c) == "RET" {
				out = append(out, c.Pos())
			}
			return true
		})
	}
	return out
}

// calls returns the names of the functions called by the statements of body,
// in order.
func calls(body *ast.BlockStmt) []string {
	var out []string
	for _, s := range body.List {
		if e, ok := s.(*ast.ExprStmt); ok {
			if c, ok := e.X.(*ast.CallExpr); ok {
				out = append(out, callName(c))
				continue
			}
		}
		out = append(out, "?")
	}
	return out
}

func callName(c *ast.CallExpr) string {
	switch fn := c.Fun.(type) {
	case *ast.Ident:
		return fn.Name
	case *ast.SelectorExpr:
		return fn.Sel.Name
	}
	return ""
}

// TestVEXVPDPBUSD checks the AVX-VNNI encoding against GNU as's ({vex}
// vpdpbusd in AT&T order, which is Go's: signed, unsigned, accumulator),
// high registers in each field included.
func TestVEXVPDPBUSD(t *testing.T) {
	for _, tc := range []struct {
		s, u, acc int
		want      []byte
	}{
		{1, 0, 2, []byte{0xc4, 0xe2, 0x7d, 0x50, 0xd1}},
		{3, 12, 13, []byte{0xc4, 0x62, 0x1d, 0x50, 0xeb}},
		{15, 0, 8, []byte{0xc4, 0x42, 0x7d, 0x50, 0xc7}},
		{10, 9, 6, []byte{0xc4, 0xc2, 0x35, 0x50, 0xf2}},
	} {
		if got := vexVPDPBUSD(tc.s, tc.u, tc.acc); !slices.Equal(got, tc.want) {
			t.Errorf("VPDPBUSD Y%d, Y%d, Y%d: % x, want % x", tc.s, tc.u, tc.acc, got, tc.want)
		}
	}
}
