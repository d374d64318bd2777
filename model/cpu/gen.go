package cpu

// The amd64 kernels are generated with avo by internal/asmgen; the generated
// files are committed so that a plain go build needs no generator.
//go:generate go run ./internal/asmgen -out kernels_amd64.s -stubs kernels_stubs_amd64.go -pkg cpu
