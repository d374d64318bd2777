// Package chat turns a conversation into the prompt text a model was trained on.
//
// A model file usually carries its own Jinja chat template
// (tokenizer.chat_template). New compiles it once with the pure-Go engine
// github.com/ardanlabs/jinja, which applies the whitespace rules HuggingFace
// transformers uses (trim_blocks and lstrip_blocks). When a file has no
// template, Builtin returns one of a few known formats by name and Fallback
// picks one from vocabulary hints.
//
// Render provides the variables HuggingFace's apply_chat_template provides for
// a plain chat: messages (each with role and content), add_generation_prompt,
// bos_token, eos_token, tools (none), and the functions raise_exception and
// strftime_now. strftime_now formats Options.Now, so a caller that fixes Now
// gets the same text every time. A template that calls raise_exception makes
// Render return a *RaiseError carrying the template's message; the shell
// should report it to the client as a bad request.
//
// Contract:
//   - New, Builtin and Fallback are called once per model; the *Template they
//     return is immutable and Render is safe to call from many goroutines.
//   - Render does not keep or modify msgs; the returned string is the
//     caller's.
//   - The package does no I/O and logs nothing. It reads the clock only when
//     Options.Now is zero.
package chat
