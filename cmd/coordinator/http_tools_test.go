package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"

	"github.com/strata-llm/strata/model"
)

// toolModel writes the demo model with the chat template of
// ../shared/chat-templates/<file> and returns its path.
func toolModel(t *testing.T, file string) string {
	t.Helper()
	src, err := os.ReadFile(filepath.Join("../../../shared/chat-templates", file))
	if err != nil {
		sharedAbsent(t, file, err)
	}
	spec := model.DemoSpec()
	spec.ChatTemplate = string(src)
	path := filepath.Join(t.TempDir(), "tools.gguf")
	if err := model.WriteRandomFile(path, spec); err != nil {
		t.Fatal(err)
	}
	return path
}

var weatherTool = openai.ChatCompletionToolUnionParam{OfFunction: &openai.ChatCompletionFunctionToolParam{
	Function: shared.FunctionDefinitionParam{
		Name:        "get_weather",
		Description: openai.String("The weather in a city"),
		Parameters: shared.FunctionParameters{
			"type": "object",
			"properties": map[string]any{
				"city": map[string]any{"type": "string", "maxLength": 12},
				"days": map[string]any{"type": "integer", "enum": []int{1, 2, 3}},
			},
			"required":             []string{"city", "days"},
			"additionalProperties": false,
		},
	},
}}

var timeTool = openai.ChatCompletionToolUnionParam{OfFunction: &openai.ChatCompletionFunctionToolParam{
	Function: shared.FunctionDefinitionParam{
		Name: "get_time",
		Parameters: shared.FunctionParameters{
			"type":                 "object",
			"properties":           map[string]any{"zone": map[string]any{"type": "string", "enum": []string{"UTC", "CET"}}},
			"required":             []string{"zone"},
			"additionalProperties": false,
		},
	},
}}

// TestSDKToolCalls drives a tool-call loop with the OpenAI Go SDK through
// a shard, for each tools template (Qwen3's and Hermes 3's <tool_call>,
// Mistral Small 3.2's [TOOL_CALLS], Llama 3.1's JSON): with tool_choice
// required (one or more calls; exactly one without parallel_tool_calls),
// or the function named (one call), the demo model's nonsense is
// constrained to valid calls
// (their arguments parse and hold the schema's required fields), returned
// as tool_calls with finish_reason "tool_calls", whole and streamed alike;
// the calls and a tool message per call with its result then render back
// through the template for the answer.
func TestSDKToolCalls(t *testing.T) {
	for _, file := range []string{
		"tools/Qwen-Qwen3-0.6B.jinja",
		"tools/NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
		"tools/Mistral-Small-3.2-24B-Instruct-2506.jinja",
		"meta-llama-Llama-3.1-8B-Instruct.jinja",
	} {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".jinja"), func(t *testing.T) {
			s := startServe(t, "--model", toolModel(t, file), "--local-shards", "1", "--threads", "2")
			client := openai.NewClient(option.WithBaseURL(s.base+"/v1/"), option.WithMaxRetries(0))
			ctx, cancel := context.WithTimeout(context.Background(), guard(time.Minute))
			defer cancel()
			msgs := []openai.ChatCompletionMessageParamUnion{openai.UserMessage("What is the weather in Oslo?")}
			several := 0
			for _, tc := range []struct {
				name     string
				choice   openai.ChatCompletionToolChoiceOptionUnionParam
				want     string
				parallel bool
				seed     int64
			}{
				{"required", openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("required")}, "", true, 3},
				{"required/2", openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("required")}, "", true, 4},
				{"required/one", openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("required")}, "", false, 3},
				{"named", openai.ToolChoiceOptionFunctionToolChoice(openai.ChatCompletionNamedToolChoiceFunctionParam{Name: "get_time"}), "get_time", true, 3},
			} {
				params := openai.ChatCompletionNewParams{
					Messages: msgs, Tools: []openai.ChatCompletionToolUnionParam{weatherTool, timeTool},
					ToolChoice: tc.choice, MaxTokens: openai.Int(160), Seed: openai.Int(tc.seed),
					ParallelToolCalls: openai.Bool(tc.parallel),
				}
				whole, err := client.Chat.Completions.New(ctx, params)
				if err != nil {
					t.Fatalf("%s: %v", tc.name, err)
				}
				ch := whole.Choices[0]
				if ch.FinishReason != "tool_calls" || len(ch.Message.ToolCalls) == 0 || (len(ch.Message.ToolCalls) > 1 && (!tc.parallel || tc.want != "")) {
					t.Fatalf("%s: finish %q, message %+v", tc.name, ch.FinishReason, ch.Message)
				}
				if len(ch.Message.ToolCalls) > 1 {
					several++
				}
				for _, call := range ch.Message.ToolCalls {
					checkCall(t, call.Function.Name, call.Function.Arguments, tc.want)
					if call.ID == "" || call.Type != "function" {
						t.Errorf("%s: call %+v", tc.name, call)
					}
				}

				stream := client.Chat.Completions.NewStreaming(ctx, params)
				var acc openai.ChatCompletionAccumulator
				for stream.Next() {
					acc.AddChunk(stream.Current())
				}
				if err := stream.Err(); err != nil {
					t.Fatalf("%s stream: %v", tc.name, err)
				}
				sc := acc.Choices[0]
				if sc.FinishReason != "tool_calls" || len(sc.Message.ToolCalls) != len(ch.Message.ToolCalls) {
					t.Fatalf("%s: streamed %+v; whole %+v", tc.name, sc.Message, ch.Message)
				}
				for i, c := range sc.Message.ToolCalls {
					if w := ch.Message.ToolCalls[i]; c.Function.Name != w.Function.Name || c.Function.Arguments != w.Function.Arguments {
						t.Fatalf("%s: streamed call %d %+v; whole %+v", tc.name, i, c, w)
					}
				}

				// The loop: the calls and their results go back; the answer is text.
				next := append(append([]openai.ChatCompletionMessageParamUnion{}, msgs...), ch.Message.ToParam())
				for _, c := range ch.Message.ToolCalls {
					next = append(next, openai.ToolMessage(`{"temperature": 21}`, c.ID))
				}
				answer, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
					Messages: next, Tools: []openai.ChatCompletionToolUnionParam{weatherTool, timeTool},
					ToolChoice: openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("none")},
					MaxTokens:  openai.Int(8),
				})
				if err != nil {
					t.Fatalf("%s answer: %v", tc.name, err)
				}
				if f := answer.Choices[0].FinishReason; f != "stop" && f != "length" || len(answer.Choices[0].Message.ToolCalls) != 0 {
					t.Errorf("%s answer: %+v", tc.name, answer.Choices[0])
				}
			}
			t.Logf("%d answers under parallel tool calls held several calls", several)
		})
	}
}

// checkCall checks a call's name (want, or either tool) and that its
// arguments hold the tool's schema.
func checkCall(t *testing.T, name, args, want string) {
	t.Helper()
	if want != "" && name != want {
		t.Errorf("called %q, want %q", name, want)
	}
	switch name {
	case "get_weather":
		var a struct {
			City *string `json:"city"`
			Days int     `json:"days"`
		}
		if err := json.Unmarshal([]byte(args), &a); err != nil || a.City == nil || len([]rune(*a.City)) > 12 || a.Days < 1 || a.Days > 3 {
			t.Errorf("get_weather arguments %s: %v", args, err)
		}
	case "get_time":
		var a struct {
			Zone string `json:"zone"`
		}
		if err := json.Unmarshal([]byte(args), &a); err != nil || (a.Zone != "UTC" && a.Zone != "CET") {
			t.Errorf("get_time arguments %s: %v", args, err)
		}
	default:
		t.Errorf("called unknown function %q (%s)", name, args)
	}
}

// TestSDKStructuredOutputs: a typed struct round trip with the OpenAI Go
// SDK through two shard stages of stories260K: the struct's strict JSON
// schema as response_format, the answer (whole and streamed, the same)
// decodes into the struct with no unknown field. Every string and number
// of the schema is bounded, so the document completes within max_tokens
// and ends with finish_reason "stop".
func TestSDKStructuredOutputs(t *testing.T) {
	type pet struct {
		Name     string   `json:"name"`
		Kind     string   `json:"kind"`
		Age      int      `json:"age"`
		Friendly bool     `json:"friendly"`
		Tags     []string `json:"tags"`
	}
	schema := map[string]any{
		"type": "object",
		"properties": map[string]any{
			"name":     map[string]any{"type": "string", "minLength": 1, "maxLength": 10},
			"kind":     map[string]any{"type": "string", "enum": []string{"cat", "dog", "fish"}},
			"age":      map[string]any{"type": "integer", "enum": []int{1, 2, 3, 4, 5}},
			"friendly": map[string]any{"type": "boolean"},
			"tags":     map[string]any{"type": "array", "items": map[string]any{"type": "string", "maxLength": 5}, "maxItems": 2},
		},
		"required":             []string{"name", "kind", "age", "friendly", "tags"},
		"additionalProperties": false,
	}
	s := startServe(t, "--model", stories, "--local-shards", "2", "--threads", "2")
	client := openai.NewClient(option.WithBaseURL(s.base+"/v1/"), option.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(context.Background(), guard(time.Minute))
	defer cancel()
	params := openai.ChatCompletionNewParams{
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Describe a pet.")},
		ResponseFormat: openai.ChatCompletionNewParamsResponseFormatUnion{OfJSONSchema: &shared.ResponseFormatJSONSchemaParam{
			JSONSchema: shared.ResponseFormatJSONSchemaJSONSchemaParam{Name: "pet", Schema: schema, Strict: openai.Bool(true)},
		}},
		MaxTokens: openai.Int(400), Seed: openai.Int(11),
	}
	whole, err := client.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	content := whole.Choices[0].Message.Content
	if whole.Choices[0].FinishReason != "stop" {
		t.Fatalf("finish %q: %q", whole.Choices[0].FinishReason, content)
	}
	dec := json.NewDecoder(strings.NewReader(content))
	dec.DisallowUnknownFields()
	var p pet
	if err := dec.Decode(&p); err != nil || p.Name == "" || len([]rune(p.Name)) > 10 || p.Age < 1 || p.Age > 5 || len(p.Tags) > 2 ||
		(p.Kind != "cat" && p.Kind != "dog" && p.Kind != "fish") {
		t.Fatalf("%q: %+v, %v", content, p, err)
	}
	stream := client.Chat.Completions.NewStreaming(ctx, params)
	var acc openai.ChatCompletionAccumulator
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if acc.Choices[0].Message.Content != content || acc.Choices[0].FinishReason != "stop" {
		t.Errorf("streamed %q (%s), whole %q", acc.Choices[0].Message.Content, acc.Choices[0].FinishReason, content)
	}
}
