package grammar

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// Grammar is a compiled response format: a pushdown automaton over bytes.
// It is immutable (its mask caches are internal and locked) and safe for
// concurrent use by any number of Matchers.
type Grammar struct {
	nodes     []node
	tries     []tnode
	root      int32 // the kRoot node
	anyString int32 // the unconstrained string node (map keys)

	mu    sync.Mutex
	masks map[*Vocab]*maskCache

	closeOnce sync.Once
	cl        *closer // distances to a whole document (close.go)
}

// SchemaError is a schema the compiler refuses: the part at Pointer (a
// JSON pointer into the schema, as a URI fragment: "#" is the root) and
// the keyword there.
type SchemaError struct {
	Pointer string
	Keyword string
	Reason  string
}

func (e *SchemaError) Error() string {
	if e.Keyword == "" {
		return fmt.Sprintf("grammar: schema at %s: %s", e.Pointer, e.Reason)
	}
	return fmt.Sprintf("grammar: schema at %s: %q %s", e.Pointer, e.Keyword, e.Reason)
}

// ErrFormat is a response_format that is not one this package knows.
var ErrFormat = errors.New("grammar: bad response_format")

// Limits on what a schema may ask for.
const (
	maxCount = 1 << 20 // minItems, maxItems, minLength, maxLength
	maxEnum  = 4096    // values in an enum
	maxNodes = 1 << 16 // compiled nodes
)

// Compile compiles an OpenAI response_format object:
// {"type":"text"} (it returns nil, nil: no constraint),
// {"type":"json_object"} (any JSON object) or
// {"type":"json_schema","json_schema":{"name":...,"schema":{...},"strict":true}}.
// An unsupported schema is a *SchemaError; a malformed response_format
// wraps ErrFormat.
func Compile(responseFormat []byte) (*Grammar, error) {
	v, err := parseJSON(responseFormat)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrFormat, err)
	}
	rf, ok := v.(*object)
	if !ok {
		return nil, fmt.Errorf("%w: must be an object", ErrFormat)
	}
	typ, _ := rf.vals["type"].(string)
	switch typ {
	case "text":
		return nil, nil
	case "json_object":
		return JSONObject(), nil
	case "json_schema":
		js, ok := rf.vals["json_schema"].(*object)
		if !ok {
			return nil, fmt.Errorf("%w: json_schema must be an object", ErrFormat)
		}
		schema, ok := js.vals["schema"]
		if !ok {
			// OpenAI's default: any JSON object.
			return JSONObject(), nil
		}
		return compileValue(schema)
	case Wrapped:
		pre, ok1 := rf.vals["prefix"].(string)
		suf, ok2 := rf.vals["suffix"].(string)
		schema, ok3 := rf.vals["schema"]
		if !ok1 || !ok2 || !ok3 || len(pre) > maxAffix || len(suf) > maxAffix {
			return nil, fmt.Errorf("%w: %s needs prefix and suffix strings of at most %d bytes and a schema", ErrFormat, Wrapped, maxAffix)
		}
		g, err := compileValue(schema)
		if err != nil {
			return nil, err
		}
		g.nodes[g.root].pre, g.nodes[g.root].suf = []byte(pre), []byte(suf)
		if sep, ok := rf.vals["separator"]; ok {
			s, ok := sep.(string)
			if !ok || len(s) > maxAffix || s == "" && pre == "" {
				return nil, fmt.Errorf("%w: %s's separator must be a string of at most %d bytes, not empty without a prefix", ErrFormat, Wrapped, maxAffix)
			}
			g.nodes[g.root].sep, g.nodes[g.root].repeat = []byte(s), true
		}
		return g, nil
	}
	return nil, fmt.Errorf("%w: type must be \"text\", \"json_object\" or \"json_schema\", got %q", ErrFormat, typ)
}

// Wrapped is the type of a response format that is not OpenAI's: a JSON
// value of a schema between a literal prefix and suffix,
// {"type":"wrapped","prefix":"<tool_call>\n","schema":{...},"suffix":"\n</tool_call>"},
// as a model's tool-call syntax wraps a call. No whitespace is allowed
// before the prefix or after the suffix, nor between the value and the
// suffix (the suffix holds the whitespace the syntax wants); the value may
// follow the prefix after whitespace. With "separator" (a string, see
// WrapRepeatFormat), one or more such values follow one another, each
// after the first preceded by the separator. The HTTP layer builds it for
// tool_choice; clients cannot send it.
const Wrapped = "wrapped"

// maxAffix bounds a wrapped grammar's prefix and suffix.
const maxAffix = 1024

// WrapFormat returns the response format of schema between prefix and
// suffix (see Wrapped), for Compile.
func WrapFormat(prefix string, schema []byte, suffix string) []byte {
	p, _ := json.Marshal(prefix)
	s, _ := json.Marshal(suffix)
	out := []byte(`{"type":"` + Wrapped + `","prefix":`)
	out = append(out, p...)
	out = append(out, `,"suffix":`...)
	out = append(out, s...)
	out = append(out, `,"schema":`...)
	return append(append(out, schema...), '}')
}

// WrapRepeatFormat is WrapFormat for one or more wrapped values, each
// after the first following sep (as a model writes several tool calls).
func WrapRepeatFormat(prefix string, schema []byte, suffix, sep string) []byte {
	f := WrapFormat(prefix, schema, suffix)
	s, _ := json.Marshal(sep)
	return append(append(append(f[:len(f)-1], `,"separator":`...), s...), '}')
}

// CompileSchema compiles a JSON Schema (the subset in the package
// documentation).
func CompileSchema(schema []byte) (*Grammar, error) {
	v, err := parseJSON(schema)
	if err != nil {
		return nil, &SchemaError{Pointer: "#", Reason: "is not valid JSON: " + err.Error()}
	}
	return compileValue(v)
}

// JSONObject returns the grammar of any JSON object.
func JSONObject() *Grammar {
	c := newCompiler(nil)
	g, err := c.finish(c.anyObject())
	if err != nil {
		panic("grammar: JSONObject: " + err.Error())
	}
	return g
}

func compileValue(schema any) (*Grammar, error) {
	c := newCompiler(schema)
	id, err := c.compile("#", schema)
	if err != nil {
		return nil, err
	}
	return c.finish(id)
}

type compiler struct {
	g    *Grammar
	doc  any
	memo map[string]int32

	anyValueID, anyObjectID int32
}

func newCompiler(doc any) *compiler {
	c := &compiler{g: &Grammar{}, doc: doc, memo: map[string]int32{}, anyValueID: -1, anyObjectID: -1}
	c.g.anyString = c.add(node{kind: kString, maxLen: -1, ptr: "#"})
	return c
}

func (c *compiler) add(n node) int32 {
	c.g.nodes = append(c.g.nodes, n)
	return int32(len(c.g.nodes) - 1)
}

// anyValue returns the node of any JSON value.
func (c *compiler) anyValue() int32 {
	if c.anyValueID >= 0 {
		return c.anyValueID
	}
	v := c.add(node{kind: kAnyOf, ptr: "#"})
	c.anyValueID = v
	obj := c.anyObject()
	arr := c.add(node{kind: kArray, child: v, maxItems: -1, ptr: "#"})
	num := c.add(node{kind: kNumber, ptr: "#"})
	lit := c.add(node{kind: kLiteral, lit: c.literals([][]byte{[]byte("true"), []byte("false"), []byte("null")}), ptr: "#"})
	c.g.nodes[v].anyOf = []int32{obj, arr, c.g.anyString, num, lit}
	return v
}

// anyObject returns the node of any JSON object.
func (c *compiler) anyObject() int32 {
	if c.anyObjectID >= 0 {
		return c.anyObjectID
	}
	id := c.add(node{kind: kMap, ptr: "#"})
	c.anyObjectID = id
	c.g.nodes[id].child = c.anyValue()
	return id
}

// literals builds a trie of the texts and returns its root.
func (c *compiler) literals(texts [][]byte) int32 {
	g := c.g
	root := int32(len(g.tries))
	g.tries = append(g.tries, tnode{term: -1})
	for _, t := range texts {
		at := root
		for _, b := range t {
			nx := g.tries[at].next(b)
			if nx < 0 {
				nx = int32(len(g.tries))
				g.tries = append(g.tries, tnode{term: -1})
				g.tries[at].kids = append(g.tries[at].kids, tedge{b, nx})
			}
			at = nx
		}
		g.tries[at].term = 0
	}
	return root
}

// Keywords that only annotate: they never change what validates.
var annotations = map[string]bool{
	"title": true, "description": true, "$comment": true, "examples": true,
	"default": true, "deprecated": true, "readOnly": true, "writeOnly": true,
	"$schema": true, "$defs": true, "definitions": true,
}

// Keywords that apply to one type each.
var typeKeywords = map[string]string{
	"properties": "object", "required": "object", "additionalProperties": "object",
	"items": "array", "minItems": "array", "maxItems": "array", "uniqueItems": "array",
	"minLength": "string", "maxLength": "string", "pattern": "string", "format": "string",
}

// refusedWhy explains keywords that are known and refused.
var refusedWhy = map[string]string{
	"oneOf":                 "is not supported (use anyOf)",
	"not":                   "is not supported",
	"if":                    "is not supported",
	"then":                  "is not supported",
	"else":                  "is not supported",
	"patternProperties":     "is not supported",
	"propertyNames":         "is not supported",
	"minProperties":         "is not supported",
	"maxProperties":         "is not supported",
	"dependentRequired":     "is not supported",
	"dependentSchemas":      "is not supported",
	"unevaluatedProperties": "is not supported",
	"unevaluatedItems":      "is not supported",
	"prefixItems":           "is not supported",
	"contains":              "is not supported",
	"minContains":           "is not supported",
	"maxContains":           "is not supported",
	"minimum":               "is not supported (numeric bounds are not enforced by the automaton)",
	"maximum":               "is not supported (numeric bounds are not enforced by the automaton)",
	"exclusiveMinimum":      "is not supported (numeric bounds are not enforced by the automaton)",
	"exclusiveMaximum":      "is not supported (numeric bounds are not enforced by the automaton)",
	"multipleOf":            "is not supported",
	"$anchor":               "is not supported",
	"$dynamicRef":           "is not supported",
	"$dynamicAnchor":        "is not supported",
	"$recursiveRef":         "is not supported",
	"$recursiveAnchor":      "is not supported",
}

func isAnnotation(ptr, k string) bool {
	return annotations[k] || strings.HasPrefix(k, "x-") || (k == "$id" && ptr == "#")
}

// compile compiles the schema v found at ptr, once per pointer, so that
// recursive references close into cycles of nodes.
func (c *compiler) compile(ptr string, v any) (int32, error) {
	if id, ok := c.memo[ptr]; ok {
		return id, nil
	}
	if len(c.g.nodes) >= maxNodes {
		return 0, &SchemaError{Pointer: ptr, Reason: fmt.Sprintf("compiles to more than %d nodes", maxNodes)}
	}
	id := c.add(node{kind: kNever, ptr: ptr})
	c.memo[ptr] = id
	n, err := c.schema(ptr, v)
	if err != nil {
		return 0, err
	}
	n.ptr = ptr
	c.g.nodes[id] = n
	return id, nil
}

func (c *compiler) schema(ptr string, v any) (node, error) {
	switch v := v.(type) {
	case bool:
		if !v {
			return node{kind: kNever}, nil
		}
		return node{kind: kRef, child: c.anyValue()}, nil
	case *object:
		return c.object(ptr, v)
	}
	return node{}, &SchemaError{Pointer: ptr, Reason: "must be an object or a boolean"}
}

func (c *compiler) object(ptr string, s *object) (node, error) {
	var constraints []string // keywords other than annotations, in order
	for _, k := range s.keys {
		if isAnnotation(ptr, k) {
			continue
		}
		if why, ok := refusedWhy[k]; ok {
			return node{}, &SchemaError{Pointer: ptr, Keyword: k, Reason: why}
		}
		switch k {
		case "type", "enum", "const", "anyOf", "allOf", "$ref":
		default:
			if typeKeywords[k] == "" {
				return node{}, &SchemaError{Pointer: ptr, Keyword: k, Reason: "is not a supported keyword"}
			}
		}
		constraints = append(constraints, k)
	}
	only := func(k string, allowed ...string) error {
		for _, o := range constraints {
			if o != k && !slices.Contains(allowed, o) {
				return &SchemaError{Pointer: ptr, Keyword: o, Reason: fmt.Sprintf("beside %q is not supported", k)}
			}
		}
		return nil
	}

	if ref, ok := s.vals["$ref"]; ok {
		if err := only("$ref"); err != nil {
			return node{}, err
		}
		rs, ok := ref.(string)
		if !ok {
			return node{}, &SchemaError{Pointer: ptr, Keyword: "$ref", Reason: "must be a string"}
		}
		target, err := c.ref(ptr, rs)
		if err != nil {
			return node{}, err
		}
		return node{kind: kRef, child: target}, nil
	}
	if all, ok := s.vals["allOf"]; ok {
		subs, ok := all.([]any)
		if !ok || len(subs) != 1 {
			return node{}, &SchemaError{Pointer: ptr, Keyword: "allOf", Reason: "is supported only with exactly one subschema"}
		}
		if err := only("allOf"); err != nil {
			return node{}, err
		}
		id, err := c.compile(ptr+"/allOf/0", subs[0])
		return node{kind: kRef, child: id}, err
	}
	if av, ok := s.vals["anyOf"]; ok {
		subs, ok := av.([]any)
		if !ok || len(subs) == 0 {
			return node{}, &SchemaError{Pointer: ptr, Keyword: "anyOf", Reason: "must be a non-empty array"}
		}
		if err := only("anyOf"); err != nil {
			return node{}, err
		}
		n := node{kind: kAnyOf}
		for i, sub := range subs {
			id, err := c.compile(ptr+"/anyOf/"+strconv.Itoa(i), sub)
			if err != nil {
				return node{}, err
			}
			n.anyOf = append(n.anyOf, id)
		}
		return n, nil
	}

	types, err := schemaTypes(ptr, s)
	if err != nil {
		return node{}, err
	}
	if _, ok := s.vals["enum"]; ok {
		return c.enum(ptr, s, types, only)
	}
	if _, ok := s.vals["const"]; ok {
		return c.enum(ptr, s, types, only)
	}
	if types == nil {
		// No type: infer it from the keywords present, or any value.
		seen := map[string]bool{}
		for _, k := range constraints {
			if t := typeKeywords[k]; t != "" {
				seen[t] = true
			}
		}
		switch len(seen) {
		case 0:
			return node{kind: kRef, child: c.anyValue()}, nil
		case 1:
			for t := range seen {
				types = []string{t}
			}
		default:
			return node{}, &SchemaError{Pointer: ptr, Keyword: "type", Reason: "is required when keywords of several types are present"}
		}
	}
	var alts []int32
	for _, t := range types {
		n, err := c.typed(ptr, s, t)
		if err != nil {
			return node{}, err
		}
		if len(types) == 1 {
			return n, nil
		}
		n.ptr = ptr
		alts = append(alts, c.add(n))
	}
	return node{kind: kAnyOf, anyOf: alts}, nil
}

// schemaTypes returns the types named by "type", or nil when absent.
func schemaTypes(ptr string, s *object) ([]string, error) {
	tv, ok := s.vals["type"]
	if !ok {
		return nil, nil
	}
	var list []any
	switch tv := tv.(type) {
	case string:
		list = []any{tv}
	case []any:
		list = tv
	}
	if len(list) == 0 {
		return nil, &SchemaError{Pointer: ptr, Keyword: "type", Reason: "must be a type name or a non-empty array of them"}
	}
	var types []string
	for _, t := range list {
		ts, _ := t.(string)
		switch ts {
		case "object", "array", "string", "number", "integer", "boolean", "null":
		default:
			return nil, &SchemaError{Pointer: ptr, Keyword: "type", Reason: fmt.Sprintf("names unknown type %v", t)}
		}
		if slices.Contains(types, ts) {
			return nil, &SchemaError{Pointer: ptr, Keyword: "type", Reason: fmt.Sprintf("names %q twice", ts)}
		}
		types = append(types, ts)
	}
	return types, nil
}

// ref resolves a local reference ("#", "#/$defs/name", any JSON pointer
// into the document) and compiles its target.
func (c *compiler) ref(ptr, ref string) (int32, error) {
	if !strings.HasPrefix(ref, "#") || (len(ref) > 1 && ref[1] != '/') {
		return 0, &SchemaError{Pointer: ptr, Keyword: "$ref", Reason: fmt.Sprintf("%q: only local references (#/...) are supported", ref)}
	}
	v := c.doc
	if len(ref) > 1 {
		for _, tok := range strings.Split(ref[2:], "/") {
			tok = strings.NewReplacer("~1", "/", "~0", "~").Replace(tok)
			switch cur := v.(type) {
			case *object:
				nv, ok := cur.get(tok)
				if !ok {
					return 0, &SchemaError{Pointer: ptr, Keyword: "$ref", Reason: fmt.Sprintf("%q names nothing in the schema", ref)}
				}
				v = nv
			case []any:
				i, err := strconv.Atoi(tok)
				if err != nil || i < 0 || i >= len(cur) {
					return 0, &SchemaError{Pointer: ptr, Keyword: "$ref", Reason: fmt.Sprintf("%q names nothing in the schema", ref)}
				}
				v = cur[i]
			default:
				return 0, &SchemaError{Pointer: ptr, Keyword: "$ref", Reason: fmt.Sprintf("%q names nothing in the schema", ref)}
			}
		}
	}
	// Keyed by the pointer, so that one target compiles once and a
	// recursive reference closes a cycle.
	return c.compile(ref, v)
}

func (c *compiler) enum(ptr string, s *object, types []string, only func(string, ...string) error) (node, error) {
	kw := "enum"
	var vals []any
	if ev, ok := s.vals["enum"]; ok {
		list, ok := ev.([]any)
		if !ok || len(list) == 0 {
			return node{}, &SchemaError{Pointer: ptr, Keyword: "enum", Reason: "must be a non-empty array"}
		}
		if len(list) > maxEnum {
			return node{}, &SchemaError{Pointer: ptr, Keyword: "enum", Reason: fmt.Sprintf("has %d values, more than %d", len(list), maxEnum)}
		}
		vals = list
		if err := only("enum", "type", "const"); err != nil {
			return node{}, err
		}
	}
	if cv, ok := s.vals["const"]; ok {
		kw = "const"
		if err := only("const", "type", "enum"); err != nil {
			return node{}, err
		}
		if vals == nil {
			vals = []any{cv}
		} else {
			// Both: the enum values equal to the const.
			vals = slices.DeleteFunc(slices.Clone(vals), func(v any) bool { return !jsonEqual(v, cv) })
		}
	}
	var texts [][]byte
	seen := map[string]bool{}
	for _, v := range vals {
		if types != nil && !typeMatches(types, v) {
			continue
		}
		t := encodeJSON(nil, v)
		if seen[string(t)] {
			continue
		}
		seen[string(t)] = true
		texts = append(texts, t)
	}
	if len(texts) == 0 {
		return node{}, &SchemaError{Pointer: ptr, Keyword: kw, Reason: "allows no value (of the type given)"}
	}
	return node{kind: kLiteral, lit: c.literals(texts)}, nil
}

func typeMatches(types []string, v any) bool {
	t := jsonType(v)
	return slices.Contains(types, t) || (t == "integer" && slices.Contains(types, "number"))
}

// jsonEqual is JSON Schema's equality: numbers by value, objects without
// regard to key order.
func jsonEqual(a, b any) bool {
	switch a := a.(type) {
	case json.Number:
		bn, ok := b.(json.Number)
		if !ok {
			return false
		}
		x, ok1 := new(big.Rat).SetString(string(a))
		y, ok2 := new(big.Rat).SetString(string(bn))
		return ok1 && ok2 && x.Cmp(y) == 0
	case []any:
		bl, ok := b.([]any)
		if !ok || len(a) != len(bl) {
			return false
		}
		for i := range a {
			if !jsonEqual(a[i], bl[i]) {
				return false
			}
		}
		return true
	case *object:
		bo, ok := b.(*object)
		if !ok || len(a.keys) != len(bo.keys) {
			return false
		}
		for _, k := range a.keys {
			bv, ok := bo.vals[k]
			if !ok || !jsonEqual(a.vals[k], bv) {
				return false
			}
		}
		return true
	}
	return a == b
}

// count reads a non-negative integer keyword, or def when absent.
func count(ptr string, s *object, kw string, def int32) (int32, error) {
	v, ok := s.vals[kw]
	if !ok {
		return def, nil
	}
	n, ok := v.(json.Number)
	if ok {
		if i, err := strconv.ParseInt(string(n), 10, 64); err == nil && i >= 0 {
			if i > maxCount {
				return 0, &SchemaError{Pointer: ptr, Keyword: kw, Reason: fmt.Sprintf("must be at most %d, got %d", maxCount, i)}
			}
			return int32(i), nil
		}
	}
	return 0, &SchemaError{Pointer: ptr, Keyword: kw, Reason: fmt.Sprintf("must be a non-negative integer, got %v", v)}
}

// typed compiles s as a schema of type t, ignoring the keywords of other
// types.
func (c *compiler) typed(ptr string, s *object, t string) (node, error) {
	switch t {
	case "object":
		return c.objectType(ptr, s)
	case "array":
		return c.arrayType(ptr, s)
	case "string":
		return c.stringType(ptr, s)
	case "number":
		return node{kind: kNumber}, nil
	case "integer":
		return node{kind: kInteger}, nil
	case "boolean":
		return node{kind: kLiteral, lit: c.literals([][]byte{[]byte("true"), []byte("false")})}, nil
	case "null":
		return node{kind: kLiteral, lit: c.literals([][]byte{[]byte("null")})}, nil
	}
	panic("grammar: unknown type " + t)
}

func (c *compiler) objectType(ptr string, s *object) (node, error) {
	var props *object
	if pv, ok := s.vals["properties"]; ok {
		if props, ok = pv.(*object); !ok {
			return node{}, &SchemaError{Pointer: ptr, Keyword: "properties", Reason: "must be an object"}
		}
	}
	required := map[string]bool{}
	if rv, ok := s.vals["required"]; ok {
		list, ok := rv.([]any)
		if !ok {
			return node{}, &SchemaError{Pointer: ptr, Keyword: "required", Reason: "must be an array of strings"}
		}
		for _, r := range list {
			name, ok := r.(string)
			if !ok {
				return node{}, &SchemaError{Pointer: ptr, Keyword: "required", Reason: "must be an array of strings"}
			}
			if _, ok := props.get(name); !ok {
				return node{}, &SchemaError{Pointer: ptr, Keyword: "required", Reason: fmt.Sprintf("names %q, which properties does not define", name)}
			}
			required[name] = true
		}
	}
	ap, hasAP := s.vals["additionalProperties"]
	switch ap.(type) {
	case nil, bool, *object:
	default:
		return node{}, &SchemaError{Pointer: ptr, Keyword: "additionalProperties", Reason: "must be a boolean or a schema"}
	}
	if props == nil || len(props.keys) == 0 {
		switch {
		case !hasAP || ap == true:
			return node{kind: kMap, child: c.anyValue()}, nil
		case ap == false:
			return node{kind: kObject, firstReq: []int32{0}}, nil
		}
		child, err := c.compile(ptr+"/additionalProperties", ap)
		return node{kind: kMap, child: child}, err
	}
	// With properties, only they are generated, which satisfies any
	// additionalProperties.
	n := node{kind: kObject}
	for _, name := range props.keys {
		id, err := c.compile(ptr+"/properties/"+pointerToken(name), props.vals[name])
		if err != nil {
			return node{}, err
		}
		n.props = append(n.props, prop{name: name, node: id, required: required[name]})
	}
	return n, nil
}

func (c *compiler) arrayType(ptr string, s *object) (node, error) {
	n := node{kind: kArray}
	var err error
	if n.minItems, err = count(ptr, s, "minItems", 0); err != nil {
		return node{}, err
	}
	if n.maxItems, err = count(ptr, s, "maxItems", -1); err != nil {
		return node{}, err
	}
	if n.maxItems >= 0 && n.maxItems < n.minItems {
		return node{}, &SchemaError{Pointer: ptr, Keyword: "maxItems", Reason: fmt.Sprintf("(%d) is less than minItems (%d)", n.maxItems, n.minItems)}
	}
	if u, ok := s.vals["uniqueItems"]; ok && u != false {
		return node{}, &SchemaError{Pointer: ptr, Keyword: "uniqueItems", Reason: "is supported only as false"}
	}
	items, ok := s.vals["items"]
	switch items.(type) {
	case []any:
		return node{}, &SchemaError{Pointer: ptr, Keyword: "items", Reason: "as an array (a tuple) is not supported"}
	}
	if !ok {
		n.child = c.anyValue()
		return n, nil
	}
	n.child, err = c.compile(ptr+"/items", items)
	return n, err
}

func (c *compiler) stringType(ptr string, s *object) (node, error) {
	n := node{kind: kString}
	var err error
	if n.minLen, err = count(ptr, s, "minLength", 0); err != nil {
		return node{}, err
	}
	if n.maxLen, err = count(ptr, s, "maxLength", -1); err != nil {
		return node{}, err
	}
	if n.maxLen >= 0 && n.maxLen < n.minLen {
		return node{}, &SchemaError{Pointer: ptr, Keyword: "maxLength", Reason: fmt.Sprintf("(%d) is less than minLength (%d)", n.maxLen, n.minLen)}
	}
	pat, hasPat := s.vals["pattern"]
	fv, hasFormat := s.vals["format"]
	if hasPat && hasFormat {
		return node{}, &SchemaError{Pointer: ptr, Keyword: "format", Reason: "beside \"pattern\" is not supported"}
	}
	kw := "pattern"
	if hasFormat {
		kw = "format"
		f, _ := fv.(string)
		p, ok := formats[f]
		if !ok {
			names := make([]string, 0, len(formats))
			for k := range formats {
				names = append(names, k)
			}
			sort.Strings(names)
			return node{}, &SchemaError{Pointer: ptr, Keyword: "format", Reason: fmt.Sprintf("%v is not supported (supported: %s)", fv, strings.Join(names, ", "))}
		}
		pat, hasPat = p, true
	}
	if !hasPat {
		return n, nil
	}
	ps, ok := pat.(string)
	if !ok {
		return node{}, &SchemaError{Pointer: ptr, Keyword: kw, Reason: "must be a string"}
	}
	if n.minLen > 0 || n.maxLen >= 0 {
		return node{}, &SchemaError{Pointer: ptr, Keyword: kw, Reason: "together with minLength or maxLength is not supported"}
	}
	d, err := compilePattern(ps)
	if err != nil {
		return node{}, &SchemaError{Pointer: ptr, Keyword: kw, Reason: err.Error()}
	}
	n.pat = d
	return n, nil
}

// formats are the supported "format" values, as patterns that accept only
// valid values (a subset of them: no leap seconds, no 29 February, upper
// case T and Z).
var formats = map[string]string{
	"date":      `^` + datePat + `$`,
	"time":      `^` + timePat + `$`,
	"date-time": `^` + datePat + `T` + timePat + `$`,
	"uuid":      `^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`,
	"ipv4":      `^(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])(\.(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])){3}$`,
}

const (
	datePat = `[0-9]{4}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|02-(0[1-9]|1[0-9]|2[0-8]))`
	timePat = `([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])`
)

// finish resolves references and anyOf, removes what can produce no finite
// value, builds the key tries and wraps the root.
func (c *compiler) finish(rootID int32) (*Grammar, error) {
	g := c.g
	nodes := g.nodes

	// Expansions: the concrete nodes each node stands for. A cycle of
	// references and anyOf adds nothing to itself; a node is memoized
	// only when its expansion did not cut a cycle through a node above it.
	expanded := make([]bool, len(nodes))
	visiting := map[int32]int{} // node → depth on the current path
	var expand func(id int32, depth int) ([]int32, int)
	expand = func(id int32, depth int) ([]int32, int) {
		n := &nodes[id]
		if n.kind != kRef && n.kind != kAnyOf {
			return []int32{id}, depth
		}
		if expanded[id] {
			return n.alts, depth
		}
		if d, ok := visiting[id]; ok {
			return nil, d
		}
		visiting[id] = depth
		low := depth
		var out []int32
		subs := n.anyOf
		if n.kind == kRef {
			subs = []int32{n.child}
		}
		for _, s := range subs {
			as, l := expand(s, depth+1)
			low = min(low, l)
			for _, a := range as {
				if !slices.Contains(out, a) {
					out = append(out, a)
				}
			}
		}
		delete(visiting, id)
		if low >= depth {
			n.alts, expanded[id] = out, true
		}
		return out, low
	}
	for id := range nodes {
		nodes[id].alts, _ = expand(int32(id), 0)
	}

	// Productive nodes: those that have a finite value (least fixed point).
	prod := make([]bool, len(nodes))
	anyProd := func(id int32) bool {
		for _, a := range nodes[id].alts {
			if prod[a] {
				return true
			}
		}
		return false
	}
	for changed := true; changed; {
		changed = false
		for id := range nodes {
			if prod[id] {
				continue
			}
			n := &nodes[id]
			p := false
			switch n.kind {
			case kString, kNumber, kInteger, kLiteral, kMap:
				p = true
			case kObject:
				p = true
				for _, pr := range n.props {
					if pr.required && !anyProd(pr.node) {
						p = false
					}
				}
			case kArray:
				p = n.minItems == 0 || anyProd(n.child)
			}
			if p {
				prod[id], changed = true, true
			}
		}
	}
	if !anyProd(rootID) {
		return nil, &SchemaError{Pointer: nodes[rootID].ptr, Reason: "admits no finite JSON value"}
	}
	for id := range nodes {
		n := &nodes[id]
		n.alts = slices.DeleteFunc(n.alts, func(a int32) bool { return !prod[a] })
		switch n.kind {
		case kObject:
			n.props = slices.DeleteFunc(n.props, func(p prop) bool { return !p.required && !anyProd(p.node) })
			c.keyTrie(n)
		case kArray:
			if !anyProd(n.child) {
				n.maxItems = 0
			}
		case kMap:
			if !anyProd(n.child) {
				n.child = -1
			}
		}
	}
	g.root = int32(len(nodes))
	g.nodes = append(nodes, node{kind: kRoot, child: rootID, ptr: "#"})
	g.nodes[g.root].alts = []int32{g.root}
	return g, nil
}

// keyTrie builds an object's key trie (keys as JSON strings, with their
// quotes) and firstReq.
func (c *compiler) keyTrie(n *node) {
	g := c.g
	np := int32(len(n.props))
	n.firstReq = make([]int32, np+1)
	n.firstReq[np] = np
	for i := np - 1; i >= 0; i-- {
		n.firstReq[i] = n.firstReq[i+1]
		if n.props[i].required {
			n.firstReq[i] = i
		}
	}
	n.keys = int32(len(g.tries))
	g.tries = append(g.tries, tnode{term: -1})
	for i, p := range n.props {
		at := n.keys
		g.tries[at].idx = append(g.tries[at].idx, int32(i))
		for _, b := range encodeJSON(nil, p.name) {
			nx := g.tries[at].next(b)
			if nx < 0 {
				nx = int32(len(g.tries))
				g.tries = append(g.tries, tnode{term: -1})
				g.tries[at].kids = append(g.tries[at].kids, tedge{b, nx})
			}
			at = nx
			g.tries[at].idx = append(g.tries[at].idx, int32(i))
		}
		g.tries[at].term = int32(i)
	}
}
