// Package grammar constrains generation to JSON: it compiles an OpenAI
// response_format ({"type":"json_object"} or a strict-mode
// {"type":"json_schema"}) into a byte-level pushdown automaton, and turns
// the automaton's state into the set of tokens that may come next, so
// that sampling from the masked logits always yields a document that
// parses and validates.
//
// # Use
//
// Once per tokenizer, build a [Vocab] with [NewVocab] (a byte trie of the
// vocabulary; ~50 ms at 50k tokens) and keep it: grammars cache masks per
// Vocab. Once per schema, [Compile] the
// response_format (or [CompileSchema] a bare schema); a [*SchemaError]
// names the JSON pointer and keyword of the part refused. Per sequence,
// [Grammar.NewMatcher]; then at each step:
//
//	mask = m.Mask(mask)      // bit id set: token id allowed
//	// logits[id] = -Inf where the bit is clear; sample
//	err := m.Advance(id)     // the sampled token; an end-of-generation token ends the document
//
// End-of-generation tokens (tokenizer IsEOG) are allowed exactly when the
// output so far is a whole document ([Matcher.Accepting]); control
// tokens with no text are never allowed. After a document ends, the mask
// is empty.
//
// # Ownership and concurrency
//
// A Vocab and a Grammar are immutable and safe for concurrent use; a
// Grammar keeps, per Vocab, a cache of masks behind a mutex, shared by all
// its matchers. A Matcher is per sequence and not safe for concurrent
// use; Clone copies one. Mask writes into the caller's slice and returns
// it; nothing returned is retained.
//
// # Determinism
//
// The mask depends only on the grammar, the vocabulary and the tokens
// advanced so far — never on the cache's contents, timing or the batch —
// so a matcher rebuilt from a sequence's token history (Reset, then
// Advance each token: what recomputation after preemption does) gives
// the same masks as the original, and the numerics contract of
// DESIGN.md holds with constrained decoding.
//
// # The schema subset
//
// Supported, following OpenAI's strict mode:
//
//   - type: object, array, string, number, integer, boolean, null, or a
//     list of them (["string","null"]); without type, the type the
//     keywords imply, or any value.
//   - object: properties (generated in the order written), required
//     (others optional, still in order), additionalProperties. With
//     properties only they are generated, which satisfies any
//     additionalProperties; without properties, additionalProperties
//     false means {}, true or absent any object, a schema an object of
//     such values (keys any string, duplicates not prevented).
//   - array: items (a schema; absent: any values; false: []), minItems,
//     maxItems, uniqueItems false.
//   - string: minLength, maxLength (in code points, as JSON Schema
//     counts), pattern, format (date, time, date-time, uuid, ipv4,
//     generated as patterns that accept only valid values: no leap
//     seconds, no 29 February, upper-case T and Z).
//   - enum, const (with type: the values of that type), anyOf, allOf of
//     exactly one schema, $ref to local pointers ("#", "#/$defs/x",
//     "#/definitions/x", any pointer into the document), recursive
//     references included, $defs, definitions; annotations (title,
//     description, default, examples, $comment, deprecated, readOnly,
//     writeOnly, $schema, $id at the root, x-*) are ignored.
//
// Patterns are read with Go's RE2 syntax (ECMA-262's common subset):
// literals, classes, ., \d \w \s, *, +, ?, {n,m}, groups, alternation, and
// ^ and $ at the ends; '.' excludes every ECMA line terminator. Without ^
// or $ a pattern may match anywhere, as JSON Schema says. Refused:
// lookaround, backreferences, \b, multi-line anchors, and patterns whose
// automaton exceeds 512 states. Each pattern becomes a DFA over code
// points with its dead states removed; characters written as UTF-8 or as
// escapes (\n, \u00e9) step it alike.
//
// Refused with a *SchemaError (the HTTP layer answers 400): oneOf, not,
// if/then/else, allOf of several, patternProperties, propertyNames,
// min/maxProperties, dependent*, unevaluated*, prefixItems, tuple items,
// contains, uniqueItems true, minimum, maximum, exclusiveMinimum,
// exclusiveMaximum, multipleOf, other formats, pattern or format together
// with minLength/maxLength, enum or const or anyOf or $ref beside
// constraint keywords, remote references, $anchor and dynamic references,
// unknown keywords, and schemas that admit no finite document (for
// example a required property that recurses forever). Subschemas that
// admit nothing are pruned (an optional property of schema false is never
// generated).
//
// # Output shape
//
// The automaton accepts a subset of the JSON that validates, chosen so
// that generation always terminates and every state can still complete:
//
//   - Whitespace: each gap between tokens (and before and after the
//     document) is nothing, one space, or a newline followed by at most
//     32 spaces or tabs, so at most 33 bytes: a model cannot loop on
//     whitespace, and pretty-printing eight levels deep at four spaces
//     still fits.
//   - Numbers: at most 15 digits before the point, 15 after, 2 in the
//     exponent, so every number is a finite float64; integers have no
//     fraction or exponent.
//   - Strings: valid UTF-8 only (no overlong forms, no surrogates, nothing
//     past U+10FFFF); escapes \" \\ \/ \b \f \n \r \t and \uXXXX except
//     surrogates (astral characters are written as UTF-8).
//   - Keys are written as encoding/json writes them (no escapes beyond
//     those it needs); enum and const values compactly, as written.
//
// # The automaton
//
// A grammar is a graph of nodes (object, map, array, string, number,
// integer, literal trie, anyOf); references and nested anyOf are resolved
// into each node's list of concrete alternatives. The matcher runs a
// pushdown automaton over bytes: a stack of frames, each a node and its
// position in it (key-trie node, items or characters still required and
// allowed, UTF-8 and escape state, pattern DFA state, whitespace count).
// A value's first byte pushes its node's frame; a closing byte pops it;
// a number or literal pops when the next byte cannot extend it. Recursive
// schemas therefore need no bound on depth. Pushing an anyOf forks the
// stack, one per alternative; the matcher follows a set of stacks (equal
// ones merged, at most 64) and a token is allowed if any survives.
//
// # Masks
//
// A mask is computed per stack from the stack's top three frames (the
// window; counts in it normalized to the longest token, since one token
// cannot use more). A depth-first walk of the vocabulary trie steps the
// window one byte per edge and skips every subtree where nothing is
// alive: tokens that keep the window alive are allowed whatever lies
// below; tokens that complete the whole window and go on ("uncertain":
// `"}]},` below a string in an object in an array) are checked at each
// step against the whole stack. Both sets are cached per window in the
// grammar (per vocabulary, at most 32 MiB, emptied when full), so after
// warm-up a mask is a copy of cached bits plus a few uncertain checks.
// The result is exact: a token's bit is set if and only if Advance would
// accept it.
//
// # Cost
//
// Measured by bench_test.go on an AMD EPYC (2 cores, shared with other
// work; medians of -count 5), over a 120-token pretty-printed document
// of a five-property schema with free, bounded and patterned strings:
//
//	                                32k llama-spm  50k gpt-2  152k synthetic
//	per token, warm (Mask+Advance)      0.48 µs     0.55 µs     0.8–1.3 µs
//	per token, first document (cold)      73 µs      141 µs      644 µs
//	first mask of a grammar               32 µs       37 µs       51 µs
//	one cold mask inside a string        1.8 ms      2.5 ms      7.5 ms
//
// The goal of at most 0.5 ms per token after warm-up holds with room to
// spare; the cold figures are paid once per window per grammar (the last
// stage should keep compiled grammars across requests). Compiling the
// schema takes ~0.1 ms; NewVocab ~50 ms at 50k tokens. The 152k
// vocabulary is gpt-2's plus variants of its tokens (leading space,
// underscore, quote, suffixes, upper case).
//
// # Dependencies
//
// The compiler is ours, on the standard library: the JSON Schema
// libraries on the module proxy (santhosh-tekuri/jsonschema, xeipuuv/
// gojsonschema, pb33f/jsonschema) are validators that decode schemas into
// maps, losing the order of properties that fixes the order of generated
// keys, and accept every keyword, whereas compiling to an automaton needs
// the refusal of what it cannot enforce, by pointer and keyword. The tests
// use github.com/santhosh-tekuri/jsonschema/v6 (maintained; passes the
// JSON-Schema-Test-Suite) as an independent oracle: every generated
// document must validate under it.
//
// # Wrapped values
//
// A response format of type [Wrapped] (built with [WrapFormat]; clients
// cannot send it) is a value of a schema between a literal prefix and
// suffix: a model's tool-call syntax around a call's JSON, such as
// "<tool_call>\n" + {"name": ..., "arguments": {...}} + "\n</tool_call>".
// The root frame steps through the prefix, the value, then the suffix; no
// whitespace goes before the prefix, after the suffix or between the value
// and the suffix (which holds the whitespace the syntax wants), so the
// automaton stays deterministic. The coordinator builds one for
// tool_choice "required" or a named function (model/chat's CallGrammar).
//
// # Wiring (not in this package)
//
// The coordinator compiles the response_format at the edge
// (coordinator/api_structured.go), answering 400 with the SchemaError's
// pointer and keyword, and sends the compact response_format with the
// sequence's first row (sample.Params.Constraint, with OutputStart: the
// position of the first generated token). The last stage
// (shard/constrain.go) compiles it, caching Grammars by the text's hash so
// that warm masks are shared across requests, builds one Vocab per model
// file, keeps a Matcher per sequence in its sampler state, reads every
// token from OutputStart on into it (prefill and decode alike), applies
// the mask as -Inf logits before sampling (penalties and temperature after
// the mask, ties to the lower ID as ever); an end-of-generation token
// sampled under the mask ends the sequence with finish_reason "stop". A
// recomputed sequence re-reads its output as prefill, which reproduces the
// masks bit for bit; after a prefix-cache hit its first row carries the
// output the cache skipped (sample.Params.Output). With the request's
// end (sample.Params.OutputEnd: prompt + max_tokens), the last stage keeps
// the document closable in time (close.go): a drawn token stands if
// [Matcher.CloseAfter] is at most the tokens left after it, else it is
// drawn again and at last the mask is cut by [Matcher.FitMask] to the
// likeliest tokens that fit and those spelling a shortest completion. A
// mask with no bit set
// cannot occur when the vocabulary can spell every byte (byte-fallback SPM
// and byte-level BPE can); should it, only the end token is left, and the
// sequence ends ("stop", the document unfinished) rather than sample
// outside the grammar.
package grammar
