package coordinator

import (
	"encoding/json"
	"net/http"
	"unicode/utf8"

	"github.com/strata-llm/strata/model/tokenizer"
)

// tokenPiece is a token as llama.cpp's /tokenize lists it with_pieces: the
// piece as a string when it is valid UTF-8, else as its bytes.
type tokenPiece struct {
	ID    int32 `json:"id"`
	Piece any   `json:"piece"`
}

// handleTokenize answers POST /tokenize in the shapes of vLLM
// ({"prompt", "add_special_tokens"} or {"messages", "add_generation_prompt"};
// answer {"count", "max_model_len", "tokens"}) and llama.cpp's server
// ({"content", "add_special", "parse_special", "with_pieces"}; answer
// {"tokens"}). The answer carries the fields of both.
func (s *Server) handleTokenize(c *call) {
	body, aerr := s.readBody(c)
	if aerr != nil {
		s.writeError(c, aerr)
		return
	}
	toks, pieces, aerr := s.tokenize(body)
	if aerr != nil {
		s.writeError(c, aerr)
		return
	}
	resp := map[string]any{"count": len(toks), "max_model_len": s.info.Context, "tokens": toks}
	if pieces {
		ps := make([]tokenPiece, len(toks))
		for i, id := range toks {
			b := s.info.Tokenizer.TokenBytes(id)
			ps[i] = tokenPiece{ID: id, Piece: string(b)}
			if !utf8.Valid(b) {
				ps[i].Piece = bytesOf(b)
			}
		}
		resp["tokens"] = ps
	}
	s.writeJSON(c, http.StatusOK, resp)
}

func (s *Server) tokenize(body []byte) (toks []int32, withPieces bool, _ *apiError) {
	f, err := decodeObject(body)
	if err != nil {
		return nil, false, err
	}
	if err := s.checkModel(f); err != nil {
		return nil, false, err
	}
	if withPieces, _, err = f.boolean("with_pieces"); err != nil {
		return nil, false, err
	}
	if _, ok := f.get("messages"); ok {
		addGen := true
		if v, ok, err := f.boolean("add_generation_prompt"); err != nil {
			return nil, false, err
		} else if ok {
			addGen = v
		}
		toks, err := s.chatTokens(f, addGen)
		return toks, withPieces, err
	}
	// vLLM's prompt adds special tokens by default, llama.cpp's content does
	// not.
	text, ok, err := f.str("prompt")
	addSpecial := true
	if err != nil {
		return nil, false, err
	}
	if !ok {
		if text, ok, err = f.str("content"); err != nil {
			return nil, false, err
		}
		if !ok {
			return nil, false, invalid("prompt", "prompt (or content, or messages) is required")
		}
		addSpecial = false
	}
	for _, name := range []string{"add_special_tokens", "add_special"} {
		if v, ok, err := f.boolean(name); err != nil {
			return nil, false, err
		} else if ok {
			addSpecial = v
		}
	}
	// Capped like a prompt: text that cannot fit the context is refused
	// before it is tokenized.
	if err := s.fitsContext("prompt", text); err != nil {
		return nil, false, err
	}
	parseSpecial := true
	if v, ok, err := f.boolean("parse_special"); err != nil {
		return nil, false, err
	} else if ok {
		parseSpecial = v
	}
	toks = s.info.Tokenizer.Encode(text, tokenizer.EncodeOptions{AddSpecial: addSpecial, ParseSpecial: parseSpecial})
	if toks == nil {
		toks = []int32{}
	}
	return toks, withPieces, nil
}

// handleDetokenize answers POST /detokenize {"tokens": [...]} with the text
// as vLLM ("prompt") and llama.cpp's server ("content") name it.
func (s *Server) handleDetokenize(c *call) {
	body, aerr := s.readBody(c)
	if aerr != nil {
		s.writeError(c, aerr)
		return
	}
	f, aerr := decodeObject(body)
	if aerr != nil {
		s.writeError(c, aerr)
		return
	}
	if aerr := s.checkModel(f); aerr != nil {
		s.writeError(c, aerr)
		return
	}
	raw, ok := f.get("tokens")
	var items []json.RawMessage
	switch {
	case !ok:
		aerr = invalid("tokens", "tokens is required")
	case kindOf(raw) != "array" || json.Unmarshal(raw, &items) != nil:
		aerr = wrongType("tokens", "an array of token IDs", raw)
	}
	if aerr != nil {
		s.writeError(c, aerr)
		return
	}
	text := ""
	if len(items) > 0 {
		if _, text, aerr = s.tokenIDs("tokens", items); aerr != nil {
			s.writeError(c, aerr)
			return
		}
	}
	s.writeJSON(c, http.StatusOK, map[string]string{"prompt": text, "content": text})
}
