package main

import (
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/ggml"
	"github.com/strata-llm/strata/model/gguf"
)

// randomSpec is the shape compared with llama.cpp: 4 layers of 256 (every
// row a multiple of 256, so llama-quantize needs no fallback types), FFN
// 512, grouped-query attention 4/2, a 2000-token vocabulary; per
// architecture as model/cpu's llama.cpp test writes them.
func randomSpec(arch string, seed uint64) model.RandomSpec {
	s := model.RandomSpec{Arch: arch, Layers: 4, Embd: 256, Heads: 4, HeadsKV: 2, FF: 512, Vocab: 2000, Context: 2048, Type: ggml.F32, Seed: seed}
	switch arch {
	case "gemma2":
		s.AttnSoftCap = 5 // scores of a few units: the cap bends them
	case "qwen2moe":
		s.Experts, s.ExpertsUsed, s.ExpertFF, s.SharedFF = 8, 2, 256, 256
	case "qwen3moe":
		s.Experts, s.ExpertsUsed, s.ExpertFF = 8, 2, 256
	case "mixtral":
		s.Experts, s.ExpertsUsed, s.FF = 8, 2, 256
	}
	return s
}

func random(args []string) error {
	fs := flag.NewFlagSet("random", flag.ContinueOnError)
	arch := fs.String("arch", "llama", "architecture (model.RandomSpec.Arch)")
	out := fs.String("out", "", "GGUF file to write")
	seed := fs.Uint64("seed", 21, "weights' seed")
	scale := fs.Float64("head-scale", 1, "multiply the output head (the token embedding where tied) by this")
	typ := fs.String("type", "F32", "matrices' type (model.MatrixTypes, by name: F32, F16, BF16, Q8_0, ...); llama-quantize writes the mixtures")
	size := fs.String("size", "", `"110M": the speed tables' dense shape (12 layers of 768, 12 heads, FFN 2048, vocabulary 32000, as scripts/benchserve writes it); "moe": the mixture-of-experts one (the same layers, 4 KV heads, 8 experts of 2048 with 2 per token, qwen2moe's shared expert 2048: about 0.53 B parameters); empty: the agreement runs' small shape`)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" {
		return errors.New("random: --out is required")
	}
	if *scale <= 0 || math.IsInf(*scale, 0) {
		return fmt.Errorf("random: --head-scale must be positive, got %v", *scale)
	}
	spec, err := sizedSpec(*arch, *size, *seed)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(model.MatrixTypes, func(t ggml.Type) bool { return t.String() == *typ })
	if i < 0 {
		return fmt.Errorf("random: --type must be one of %v, got %q", model.MatrixTypes, *typ)
	}
	spec.Type = model.MatrixTypes[i]
	if *scale != 1 && spec.Type != ggml.F32 {
		return fmt.Errorf("random: --head-scale rewrites an F32 file; --type %s is not", *typ)
	}
	if err := model.WriteRandomFile(*out, spec); err != nil {
		return err
	}
	if *scale == 1 {
		return nil
	}
	return scaleHead(*out, float32(*scale))
}

// sizedSpec is randomSpec at a speed table's size: "110M" (dense), "moe"
// (mixture of experts) or "" (randomSpec's own small shape).
func sizedSpec(arch, size string, seed uint64) (model.RandomSpec, error) {
	spec := randomSpec(arch, seed)
	switch size {
	case "":
		return spec, nil
	case "110M":
		spec.Layers, spec.Embd, spec.Heads, spec.HeadsKV, spec.FF, spec.Vocab = 12, 768, 12, 12, 2048, 32000
		if spec.Experts > 0 {
			return spec, fmt.Errorf("random: --size 110M is the dense shape; %s wants --size moe", arch)
		}
	case "moe":
		if spec.Experts == 0 {
			return spec, fmt.Errorf("random: --size moe is the mixture-of-experts shape; %s wants --size 110M", arch)
		}
		spec.Layers, spec.Embd, spec.Heads, spec.HeadsKV, spec.FF, spec.Vocab = 12, 768, 12, 4, 2048, 32000
		spec.Experts, spec.ExpertsUsed, spec.ExpertFF = 8, 2, 2048
		if spec.SharedFF > 0 {
			spec.SharedFF = 2048
		}
	default:
		return spec, fmt.Errorf("random: --size must be 110M, moe or empty, got %q", size)
	}
	// Gemma 3's window: wider than a speed run's 192 positions, so both
	// programs attend over the same keys as on a global layer.
	spec.SlidingWindow = 1024
	return spec, spec.Validate()
}

// scaleHead rewrites the F32 file at path with output.weight (else
// token_embd.weight) multiplied by k: the logits scale by k, so the gap
// between the top two tokens grows k-fold while the model stays the same
// function up to the final softmax's temperature.
func scaleHead(path string, k float32) error {
	f, err := gguf.Open(path)
	if err != nil {
		return err
	}
	name := "output.weight"
	if _, err := f.Tensor(name); err != nil {
		name = "token_embd.weight"
	}
	var ts []gguf.WriteTensor
	for _, t := range f.Tensors {
		data := append([]byte(nil), t.Data...)
		if t.Name == name {
			if t.Type != ggml.F32 {
				f.Close()
				return fmt.Errorf("scale %s: %s is %v, want F32", path, name, t.Type)
			}
			for i := 0; i+4 <= len(data); i += 4 {
				v := math.Float32frombits(binary.LittleEndian.Uint32(data[i:]))
				binary.LittleEndian.PutUint32(data[i:], math.Float32bits(v*k))
			}
		}
		ts = append(ts, gguf.WriteTensor{Name: t.Name, Type: t.Type, Dims: t.Dims, Data: data})
	}
	kvs := f.KV
	f.Close()
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := gguf.Write(tmp, kvs, ts); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
