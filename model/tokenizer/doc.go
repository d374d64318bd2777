// Package tokenizer turns text into token IDs and back, using the vocabulary
// stored in a GGUF file, and reproduces llama.cpp's tokenizers exactly.
//
// Two vocabulary models are supported:
//
//   - "llama": SentencePiece-style BPE (llama.cpp's SPM tokenizer). Spaces
//     become U+2581, a dummy-prefix space is added to each text fragment,
//     adjacent symbols merge by token score, and text the vocabulary cannot
//     cover falls back to <0xNN> byte tokens.
//   - "gpt2": byte-level BPE. Text is split into words by the pre-tokenizer
//     named in tokenizer.ggml.pre (gpt-2, llama3/llama-bpe, qwen2, smollm and
//     their aliases; see [New]), each byte is mapped to a printable code
//     point, and pairs merge by their rank in tokenizer.ggml.merges.
//
// # Use
//
// Build a Tokenizer once with [FromGGUF] (or [New] from a [Vocab] assembled by
// hand), then call [Tokenizer.Encode], [Tokenizer.Decode] and friends.
// Generated tokens are turned into text with a [Decoder] from
// [Tokenizer.NewDecoder]: it holds back bytes until they form whole UTF-8
// characters, so a character split across byte tokens is never emitted in
// halves.
//
// # Ownership and concurrency
//
// A Tokenizer is immutable after New returns and safe for concurrent use by
// any number of goroutines. New copies the slices of the Vocab it is given;
// the caller may reuse them. Every slice and string a Tokenizer returns is
// new, owned by the caller. A Decoder holds per-stream state and is not safe
// for concurrent use; use one per generation stream.
//
// # Fidelity to llama.cpp
//
// Encode(text, EncodeOptions{AddSpecial, ParseSpecial}) returns what
// llama.cpp's llama_tokenize(text, add_special, parse_special) returns,
// including its special-token partitioning (user-defined tokens are always
// split out; control tokens only when ParseSpecial is set), its per-model
// token attribute fix-ups, and its end-of-generation token set.
//
// Decode differs from llama_detokenize in two documented ways: it does not
// apply the lossy clean-up of tokenization spaces that llama.cpp applies to
// some BPE vocabularies (" ," → ","), and it strips the dummy-prefix space
// from the first piece that renders text, where llama.cpp strips it only
// from the first token (which is often BOS, rendering nothing), so that
// Decode(Encode(s, {AddSpecial: true})) == s for plain text. A Decoder
// renders each token as llama.cpp's token_to_piece does (lstrip 0): it keeps
// the dummy-prefix space, since generated tokens continue a prompt.
package tokenizer
