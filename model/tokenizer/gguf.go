package tokenizer

import (
	"errors"
	"fmt"
	"math"

	"github.com/strata-llm/strata/model/gguf"
)

// GGUF metadata keys read by FromGGUF.
const (
	KeyModel       = "tokenizer.ggml.model"
	KeyPre         = "tokenizer.ggml.pre"
	KeyTokens      = "tokenizer.ggml.tokens"
	KeyScores      = "tokenizer.ggml.scores"
	KeyTokenType   = "tokenizer.ggml.token_type"
	KeyMerges      = "tokenizer.ggml.merges"
	KeyBOS         = "tokenizer.ggml.bos_token_id"
	KeyEOS         = "tokenizer.ggml.eos_token_id"
	KeyEOT         = "tokenizer.ggml.eot_token_id"
	KeyEOM         = "tokenizer.ggml.eom_token_id"
	KeyUNK         = "tokenizer.ggml.unknown_token_id"
	KeyPAD         = "tokenizer.ggml.padding_token_id"
	KeyFIMPre      = "tokenizer.ggml.fim_pre_token_id"
	KeyFIMSuf      = "tokenizer.ggml.fim_suf_token_id"
	KeyFIMMid      = "tokenizer.ggml.fim_mid_token_id"
	KeyFIMPad      = "tokenizer.ggml.fim_pad_token_id"
	KeyFIMRep      = "tokenizer.ggml.fim_rep_token_id"
	KeyFIMSep      = "tokenizer.ggml.fim_sep_token_id"
	KeyAddBOS      = "tokenizer.ggml.add_bos_token"
	KeyAddEOS      = "tokenizer.ggml.add_eos_token"
	KeyAddPrefix   = "tokenizer.ggml.add_space_prefix"
	keyGeneralName = "general.name"

	// Deprecated spellings of the first three FIM keys, read when present.
	keyPrefixID = "tokenizer.ggml.prefix_token_id"
	keySuffixID = "tokenizer.ggml.suffix_token_id"
	keyMiddleID = "tokenizer.ggml.middle_token_id"
)

// FromGGUF reads the vocabulary from f's tokenizer.ggml.* keys and builds a
// Tokenizer, filling absent keys with llama.cpp's defaults: for "llama" BOS 1,
// EOS 2, UNK 0, add BOS, add a space prefix; for "gpt2" BOS and EOS 11 (if in
// range), no BOS unless the pre-tokenizer or the file asks. A special-token ID
// out of range is ignored in favour of the default, as llama.cpp does.
func FromGGUF(f *gguf.File) (*Tokenizer, error) {
	v, err := VocabFromGGUF(f)
	if err != nil {
		return nil, err
	}
	return New(v)
}

// VocabFromGGUF reads the vocabulary FromGGUF would build a Tokenizer from.
func VocabFromGGUF(f *gguf.File) (Vocab, error) {
	v := Vocab{
		BOS: -1, EOS: -1, EOT: -1, EOM: -1, UNK: -1, PAD: -1,
		FIMPre: -1, FIMSuf: -1, FIMMid: -1, FIMPad: -1, FIMRep: -1, FIMSep: -1,
	}
	var err error
	if v.Model, err = f.String(KeyModel); err != nil {
		return v, fmt.Errorf("tokenizer: %w", err)
	}
	if f.Has(KeyPre) {
		if v.Pre, err = f.String(KeyPre); err != nil {
			return v, fmt.Errorf("tokenizer: %w", err)
		}
	}
	if f.Has(keyGeneralName) {
		v.Name, _ = f.String(keyGeneralName) // only a hint for fix-ups
	}
	if v.Tokens, err = f.Strings(KeyTokens); err != nil {
		return v, fmt.Errorf("tokenizer: %w", err)
	}
	n := len(v.Tokens)

	switch v.Model {
	case ModelSPM:
		v.BOS, v.EOS, v.UNK = 1, 2, 0
		v.AddBOS, v.AddSpacePrefix = true, true
	case ModelBPE:
		pre, err := lookupPre(v.Pre)
		if err != nil {
			return v, err
		}
		if v.Merges, err = f.Strings(KeyMerges); err != nil {
			return v, fmt.Errorf("tokenizer: %w", err)
		}
		v.BOS, v.EOS = 11, 11
		if pre.noBOS {
			v.BOS = -1
		}
		v.AddBOS = pre.addBOS
	default:
		return v, fmt.Errorf("%w: %s = %q (want %q or %q)", ErrUnsupported, KeyModel, v.Model, ModelSPM, ModelBPE)
	}

	if f.Has(KeyScores) {
		if v.Scores, err = f.Float32s(KeyScores); err != nil {
			ints, ierr := f.Int32s(KeyScores)
			if ierr != nil {
				return v, fmt.Errorf("tokenizer: %w", err)
			}
			v.Scores = make([]float32, len(ints))
			for i, x := range ints {
				v.Scores[i] = float32(x)
			}
		}
		if len(v.Scores) < n {
			return v, fmt.Errorf("%w: %s has %d entries for %d tokens", ErrInvalid, KeyScores, len(v.Scores), n)
		}
	}
	if f.Has(KeyTokenType) {
		if v.Types, err = f.Int32s(KeyTokenType); err != nil {
			return v, fmt.Errorf("tokenizer: %w", err)
		}
		if len(v.Types) < n {
			return v, fmt.Errorf("%w: %s has %d entries for %d tokens", ErrInvalid, KeyTokenType, len(v.Types), n)
		}
	}

	ids := []struct {
		key string
		id  *int32
	}{
		{KeyBOS, &v.BOS}, {KeyEOS, &v.EOS}, {KeyEOT, &v.EOT}, {KeyEOM, &v.EOM},
		{KeyUNK, &v.UNK}, {KeyPAD, &v.PAD},
		{KeyFIMPre, &v.FIMPre}, {KeyFIMSuf, &v.FIMSuf}, {KeyFIMMid, &v.FIMMid},
		{KeyFIMPad, &v.FIMPad}, {KeyFIMRep, &v.FIMRep}, {KeyFIMSep, &v.FIMSep},
		{keyPrefixID, &v.FIMPre}, {keySuffixID, &v.FIMSuf}, {keyMiddleID, &v.FIMMid},
	}
	for _, k := range ids {
		if *k.id >= int32(n) {
			*k.id = -1 // a default out of range is disabled
		}
		if !f.Has(k.key) {
			continue
		}
		id, err := readID(f, k.key)
		if err != nil {
			return v, err
		}
		if id < uint64(n) {
			*k.id = int32(id)
		} // else llama.cpp warns and keeps the default
	}

	for _, k := range []struct {
		key string
		b   *bool
	}{{KeyAddBOS, &v.AddBOS}, {KeyAddEOS, &v.AddEOS}, {KeyAddPrefix, &v.AddSpacePrefix}} {
		if !f.Has(k.key) {
			continue
		}
		if *k.b, err = f.Bool(k.key); err != nil {
			return v, fmt.Errorf("tokenizer: %w", err)
		}
	}
	if v.AddBOS && v.BOS < 0 {
		return v, fmt.Errorf("%w: %s is true, but %s is not set", ErrInvalid, KeyAddBOS, KeyBOS)
	}
	if v.AddEOS && v.EOS < 0 {
		return v, fmt.Errorf("%w: %s is true, but %s is not set", ErrInvalid, KeyAddEOS, KeyEOS)
	}
	return v, nil
}

// readID reads a token ID key, which llama.cpp reads as a uint32. A negative
// value (some converters write -1 for "none") reads as out of range.
func readID(f *gguf.File, key string) (uint64, error) {
	id, err := f.Uint(key)
	if err == nil {
		return id, nil
	}
	if errors.Is(err, gguf.ErrWrongType) {
		if _, ierr := f.Int(key); ierr == nil {
			return math.MaxUint64, nil // negative
		}
	}
	return 0, fmt.Errorf("tokenizer: %w", err)
}
