package coordinator

import (
	"fmt"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/chat"
	"github.com/strata-llm/strata/model/gguf"
	"github.com/strata-llm/strata/model/tokenizer"
)

// ModelInfo is what the API needs to know about the served model.
type ModelInfo struct {
	Name      string // the model ID clients name (and /v1/models lists)
	Context   int    // tokens: prompt + generated
	Vocab     int
	Tokenizer *tokenizer.Tokenizer
	Template  *chat.Template // the file's chat template, or a fallback
	BOS, EOS  string         // token texts the template may use
	// Stop lists the end-of-generation token IDs every request stops at.
	Stop []int32
}

// NewModelInfo describes a loaded model. name is what clients call it.
func NewModelInfo(name string, f *gguf.File, m *model.Model, tok *tokenizer.Tokenizer) (*ModelInfo, error) {
	info := &ModelInfo{Name: name, Context: m.Context, Vocab: m.Vocab, Tokenizer: tok}
	if src, err := f.String("tokenizer.chat_template"); err == nil {
		t, err := chat.New(src)
		if err != nil {
			return nil, fmt.Errorf("coordinator: the model's tokenizer.chat_template: %w", err)
		}
		info.Template = t
	} else {
		info.Template = chat.Fallback(func(s string) bool { _, ok := tok.Lookup(s); return ok })
	}
	if id := tok.BOS(); id >= 0 {
		info.BOS = tok.Piece(id)
	}
	if id := tok.EOS(); id >= 0 {
		info.EOS = tok.Piece(id)
	}
	for id := 0; id < tok.VocabSize(); id++ {
		if tok.IsEOG(int32(id)) {
			info.Stop = append(info.Stop, int32(id))
		}
	}
	return info, nil
}
