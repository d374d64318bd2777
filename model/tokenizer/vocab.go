package tokenizer

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// ErrUnsupported is wrapped by the errors for vocabularies this package cannot
// tokenize: an unknown tokenizer model or pre-tokenizer.
var ErrUnsupported = errors.New("tokenizer: unsupported vocabulary")

// ErrInvalid is wrapped by the errors for inconsistent vocabularies: duplicate
// tokens, arrays of the wrong length, special-token IDs out of range.
var ErrInvalid = errors.New("tokenizer: invalid vocabulary")

// Token types as stored in tokenizer.ggml.token_type (llama.cpp's
// llama_token_type).
const (
	TypeUndefined   int32 = 0
	TypeNormal      int32 = 1
	TypeUnknown     int32 = 2
	TypeControl     int32 = 3
	TypeUserDefined int32 = 4
	TypeUnused      int32 = 5
	TypeByte        int32 = 6
)

// Vocabulary models, the values of tokenizer.ggml.model.
const (
	ModelSPM = "llama" // SentencePiece-style BPE
	ModelBPE = "gpt2"  // byte-level BPE
)

// Vocab is a vocabulary as a GGUF file stores it under tokenizer.ggml.*.
//
// Every ID field is -1 when the vocabulary has no such token; 0 is a real
// token ID. FromGGUF fills in llama.cpp's defaults for absent keys; New takes
// the fields as they are.
type Vocab struct {
	// Model is tokenizer.ggml.model: ModelSPM or ModelBPE.
	Model string
	// Pre is tokenizer.ggml.pre, the pre-tokenizer of a BPE vocabulary.
	// It is ignored for SPM.
	Pre string
	// Name is general.name. llama.cpp keys some token attribute fix-ups on
	// it (Phi-3's special tokens strip the whitespace that follows them).
	Name string

	// Tokens holds each token's text, indexed by ID.
	Tokens []string
	// Scores holds each token's score; nil means all zero. SPM merges the
	// adjacent pair whose merged token has the highest score first.
	Scores []float32
	// Types holds each token's type (TypeNormal, ...); nil means all normal.
	Types []int32
	// Merges holds the BPE merge rules, "left right", best first.
	Merges []string

	BOS, EOS, EOT, EOM, UNK, PAD int32
	// Fill-in-the-middle tokens. FIMPad, FIMRep and FIMSep end generation.
	FIMPre, FIMSuf, FIMMid, FIMPad, FIMRep, FIMSep int32

	// AddBOS and AddEOS say whether Encode with AddSpecial adds BOS and EOS.
	AddBOS, AddEOS bool
	// AddSpacePrefix says whether SPM adds a space before the text (and
	// after each special token in it).
	AddSpacePrefix bool
}

// Token attributes, llama.cpp's llama_token_attr bits.
type attr uint16

const (
	attrUnknown attr = 1 << iota
	attrUnused
	attrNormal
	attrControl
	attrUserDefined
	attrByte
	attrNormalized
	attrLStrip
	attrRStrip
	attrSingleWord
)

func attrOfType(t int32) attr {
	switch t {
	case TypeUnknown:
		return attrUnknown
	case TypeUnused:
		return attrUnused
	case TypeNormal:
		return attrNormal
	case TypeControl:
		return attrControl
	case TypeUserDefined:
		return attrUserDefined
	case TypeByte:
		return attrByte
	}
	return 0 // undefined, and any value llama.cpp does not know
}

// Tokenizer encodes text to token IDs and decodes them back. It is immutable
// and safe for concurrent use.
type Tokenizer struct {
	spm    bool
	tokens []string
	scores []float32
	attrs  []attr
	ids    map[string]int32

	// BPE
	ranks        map[string]int32 // "left right" -> rank
	pre          preTokenizer
	ignoreMerges bool
	byteToken    [256]int32 // SPM: <0xNN> (or the byte itself); -1 if none

	bos, eos, eot, eom, unk, pad int32
	addBOS, addEOS, addSpace     bool

	eog     map[int32]bool
	special []int32 // control, user-defined and unknown tokens, longest first

	// maxCover is the most input bytes other than spaces that one token
	// can stand for (see MinTokens).
	maxCover int
}

// New builds a Tokenizer from v, applying llama.cpp's load-time fix-ups:
// empty tokens become "[EMPTY_<id>]", end-of-turn and fill-in-the-middle
// tokens absent from v are found by their text, and the end-of-generation set
// is derived the way llama.cpp derives it.
func New(v Vocab) (*Tokenizer, error) {
	n := len(v.Tokens)
	if n == 0 {
		return nil, fmt.Errorf("%w: no tokens", ErrInvalid)
	}
	if n > 1<<30 {
		return nil, fmt.Errorf("%w: %d tokens, limit %d", ErrInvalid, n, 1<<30)
	}
	if v.Scores != nil && len(v.Scores) < n {
		return nil, fmt.Errorf("%w: %d scores for %d tokens", ErrInvalid, len(v.Scores), n)
	}
	if v.Types != nil && len(v.Types) < n {
		return nil, fmt.Errorf("%w: %d token types for %d tokens", ErrInvalid, len(v.Types), n)
	}
	t := &Tokenizer{
		tokens:   make([]string, n),
		scores:   make([]float32, n),
		attrs:    make([]attr, n),
		ids:      make(map[string]int32, n),
		addBOS:   v.AddBOS,
		addEOS:   v.AddEOS,
		addSpace: v.AddSpacePrefix,
	}
	switch v.Model {
	case ModelSPM:
		t.spm = true
	case ModelBPE:
		pre, err := lookupPre(v.Pre)
		if err != nil {
			return nil, err
		}
		t.pre = pre
		t.ignoreMerges = pre.ignoreMerges
		t.addSpace = false // llama.cpp: only SPM adds a dummy prefix
	default:
		return nil, fmt.Errorf("%w: tokenizer.ggml.model %q (want %q or %q)", ErrUnsupported, v.Model, ModelSPM, ModelBPE)
	}

	for i, s := range v.Tokens {
		if s == "" {
			s = "[EMPTY_" + strconv.Itoa(i) + "]"
		}
		if j, dup := t.ids[s]; dup {
			return nil, fmt.Errorf("%w: duplicate token %q has IDs %d and %d", ErrInvalid, s, j, i)
		}
		t.ids[s] = int32(i)
		t.tokens[i] = s
		if v.Scores != nil {
			t.scores[i] = v.Scores[i]
		}
		if v.Types != nil {
			t.attrs[i] = attrOfType(v.Types[i])
		} else {
			t.attrs[i] = attrNormal
		}
	}

	if !t.spm {
		t.ranks = make(map[string]int32, len(v.Merges))
		for i, m := range v.Merges {
			// llama.cpp splits at the first space after the first byte; a
			// rule without one can never match.
			if len(m) < 2 || strings.IndexByte(m[1:], ' ') < 0 {
				continue
			}
			if _, ok := t.ranks[m]; !ok {
				t.ranks[m] = int32(i)
			}
		}
	}

	ids := []struct {
		name string
		id   *int32
		src  int32
	}{
		{"BOS", &t.bos, v.BOS}, {"EOS", &t.eos, v.EOS}, {"EOT", &t.eot, v.EOT},
		{"EOM", &t.eom, v.EOM}, {"UNK", &t.unk, v.UNK}, {"PAD", &t.pad, v.PAD},
	}
	for _, f := range ids {
		if f.src < -1 || f.src >= int32(n) {
			return nil, fmt.Errorf("%w: %s token %d out of range [0, %d)", ErrInvalid, f.name, f.src, n)
		}
		*f.id = f.src
	}
	fim := []int32{v.FIMPre, v.FIMSuf, v.FIMMid, v.FIMPad, v.FIMRep, v.FIMSep}
	for i, id := range fim {
		if id < -1 || id >= int32(n) {
			return nil, fmt.Errorf("%w: FIM token %d out of range [0, %d)", ErrInvalid, id, n)
		}
		fim[i] = id
	}
	if t.addBOS && t.bos < 0 {
		return nil, fmt.Errorf("%w: AddBOS is set but there is no BOS token", ErrInvalid)
	}
	if t.addEOS && t.eos < 0 {
		return nil, fmt.Errorf("%w: AddEOS is set but there is no EOS token", ErrInvalid)
	}

	t.fixAttrs(fim, strings.ToLower(v.Name))

	for b := range 256 {
		t.byteToken[b] = -1
		if id, ok := t.ids[fmt.Sprintf("<0x%02X>", b)]; ok {
			t.byteToken[b] = id
		} else if id, ok := t.ids[string([]byte{byte(b)})]; ok {
			t.byteToken[b] = id
		}
	}
	t.maxCover = t.coverBound()
	return t, nil
}

// eotTexts are the texts llama.cpp takes for an end-of-turn token when the
// file names none.
var eotTexts = []string{
	"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
	"<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>",
	"<end_of_utterance>",
}

// fimTexts are the texts of the fill-in-the-middle tokens, in the order of
// Vocab's FIM fields.
var fimTexts = [][]string{
	{"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>", "<|prefix|>"},
	{"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>", "<|suffix|>"},
	{"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>", "<|middle|>"},
	{"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"},
	{"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"},
	{"<|file_sep|>"},
}

// eogTexts are the texts llama.cpp treats as end of generation.
var eogTexts = []string{
	"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
	"<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>",
	"_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>",
	"<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[",
}

// findText returns the lowest ID among the tokens whose text is one of texts,
// or -1. (llama.cpp takes the first in hash-map order; the lowest ID makes the
// choice deterministic.)
func (t *Tokenizer) findText(texts []string) int32 {
	best := int32(-1)
	for _, s := range texts {
		if id, ok := t.ids[s]; ok && (best < 0 || id < best) {
			best = id
		}
	}
	return best
}

// fixAttrs applies llama.cpp's load-time token fix-ups (llama_vocab::impl::
// load, after the special-token keys are read): it detects EOT, EOM and FIM
// tokens by text, marks control tokens named "unused", builds the
// end-of-generation set and the special-token list, and sets the per-model
// strip attributes. name is general.name in lower case.
func (t *Tokenizer) fixAttrs(fim []int32, name string) {
	markControl := func(id int32) {
		if id >= 0 {
			t.attrs[id] |= attrControl
		}
	}
	if t.eot < 0 {
		t.eot = t.findText(eotTexts)
		markControl(t.eot)
	}
	if t.eom < 0 {
		t.eom = t.findText([]string{"<|eom_id|>"})
		markControl(t.eom)
	}
	for i := range fim {
		if fim[i] < 0 {
			fim[i] = t.findText(fimTexts[i])
			markControl(fim[i])
		}
	}
	for i, s := range t.tokens {
		if t.attrs[i]&attrControl != 0 && strings.Contains(s, "unused") {
			t.attrs[i] |= attrUnused
		}
	}

	t.eog = make(map[int32]bool)
	for _, id := range fim[3:] { // pad, repo, file separator
		if id >= 0 {
			t.eog[id] = true
		}
	}
	for _, s := range eogTexts {
		if id, ok := t.ids[s]; ok {
			t.eog[id] = true
			t.attrs[id] |= attrControl
		}
	}
	// gpt-oss: these always render.
	for _, s := range []string{"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"} {
		if id, ok := t.ids[s]; ok {
			t.attrs[id] = attrUserDefined
		}
	}
	for _, id := range []int32{t.eos, t.eot, t.eom} {
		if id >= 0 {
			t.eog[id] = true
		}
	}
	// o200k_harmony and solar-open: <|end|> ends a message, not generation.
	has := func(s string) (int32, bool) {
		id, ok := t.ids[s]
		return id, ok && t.eog[id]
	}
	_, ret := has("<|return|>")
	_, call := has("<|call|>")
	_, calls := has("<|calls|>")
	_, flush := has("<|flush|>")
	if end, ok := has("<|end|>"); ok && ((ret && (call || calls)) || ((call || calls) && flush)) {
		delete(t.eog, end)
		t.attrs[end] = attrUserDefined
	}
	// gemma4 and paddleocr: </s> is not end of generation.
	if _, tr := has("<|tool_response>"); tr {
		if s, ok := has("</s>"); ok {
			delete(t.eog, s)
			t.attrs[s] = attrNormal
		}
	}

	for i, a := range t.attrs {
		if a&(attrControl|attrUserDefined|attrUnknown) != 0 {
			t.special = append(t.special, int32(i))
		}
	}
	// Longest first; llama.cpp's sort leaves ties in no particular order,
	// the ID breaks them here.
	slices.SortStableFunc(t.special, func(a, b int32) int {
		return cmp.Compare(len(t.tokens[b]), len(t.tokens[a]))
	})

	if strings.Contains(name, "phi-3") || strings.Contains(name, "phi3") {
		for _, id := range t.special {
			t.attrs[id] |= attrRStrip
		}
		if id, ok := t.ids["</s>"]; ok {
			t.attrs[id] |= attrRStrip
		}
		for _, s := range []string{"<unk>", "<s>", "<|endoftext|>"} {
			if id, ok := t.ids[s]; ok {
				t.attrs[id] &^= attrRStrip
			}
		}
	}
}

// VocabSize returns the number of tokens in the vocabulary.
func (t *Tokenizer) VocabSize() int { return len(t.tokens) }

// BOS returns the beginning-of-sequence token, or -1.
func (t *Tokenizer) BOS() int32 { return t.bos }

// EOS returns the end-of-sequence token, or -1.
func (t *Tokenizer) EOS() int32 { return t.eos }

// EOT returns the end-of-turn token, or -1.
func (t *Tokenizer) EOT() int32 { return t.eot }

// UNK returns the unknown token, or -1.
func (t *Tokenizer) UNK() int32 { return t.unk }

// PAD returns the padding token, or -1.
func (t *Tokenizer) PAD() int32 { return t.pad }

// AddBOS reports whether Encode with AddSpecial prepends BOS.
func (t *Tokenizer) AddBOS() bool { return t.addBOS }

// AddEOS reports whether Encode with AddSpecial appends EOS.
func (t *Tokenizer) AddEOS() bool { return t.addEOS }

// IsEOG reports whether id ends generation: EOS, EOT, EOM, and the other
// tokens llama.cpp treats as end of generation (<|im_end|>, <|endoftext|>,
// <end_of_turn>, ... when present, and the FIM pad, repo and separator).
func (t *Tokenizer) IsEOG(id int32) bool { return t.eog[id] }

// IsControl reports whether id is a control token, one that Decode does not
// render.
func (t *Tokenizer) IsControl(id int32) bool {
	return id >= 0 && int(id) < len(t.attrs) && t.attrs[id]&attrControl != 0
}

// Lookup returns the ID of the token whose text is s.
func (t *Tokenizer) Lookup(s string) (int32, bool) {
	id, ok := t.ids[s]
	return id, ok
}

// coverBound returns the most input bytes one token can stand for: its text
// as the vocabulary stores it is never shorter than the bytes it matches
// (SPM's U+2581 is 3 bytes for a 1-byte space; GPT-2's byte alphabet spends
// 1 or 2 bytes per byte; control and user-defined tokens match their text),
// and an unknown token stands for one character, at most 4 bytes.
func (t *Tokenizer) coverBound() int {
	m := utf8.UTFMax
	for _, s := range t.tokens {
		m = max(m, len(s))
	}
	return m
}

// MinTokens returns a lower bound on the number of tokens Encode makes of
// text, with any options, in one pass and without tokenizing: every byte
// but whitespace lies inside some token's match, and no token matches more
// than maxCover bytes. (Whitespace is not counted because special tokens
// with lstrip/rstrip swallow any run of it.) A server checks it against the
// context before it spends CPU on a prompt that can never fit.
func (t *Tokenizer) MinTokens(text string) int {
	n := 0
	for i := 0; i < len(text); i++ {
		if strings.IndexByte(cSpace, text[i]) < 0 {
			n++
		}
	}
	return (n + t.maxCover - 1) / t.maxCover
}
