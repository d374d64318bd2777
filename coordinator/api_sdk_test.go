package coordinator

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"
)

// TestOpenAISDK drives the API with the official OpenAI Go SDK: completions
// and chat, stream and not, stop strings, usage, errors.
func TestOpenAISDK(t *testing.T) {
	h := newHarness(t, harnessOpts{cfg: ServerConfig{APIKey: "sk-test"}})
	ctx := context.Background()
	client := openai.NewClient(option.WithBaseURL(h.http.URL+"/v1/"), option.WithAPIKey("sk-test"), option.WithMaxRetries(0))

	toks := expectTokens(h.info, textPromptLast, 12)
	full := expectText(h.info.Tokenizer, h.info, toks)

	t.Run("completion", func(t *testing.T) {
		c, err := client.Completions.New(ctx, openai.CompletionNewParams{
			Model:     testModel,
			Prompt:    openai.CompletionNewParamsPromptUnion{OfArrayOfTokens: []int64{1, textPromptLast}},
			MaxTokens: openai.Int(12),
			Seed:      openai.Int(7),
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(c.Choices) != 1 || c.Choices[0].Text != full || c.Choices[0].FinishReason != "length" {
			t.Fatalf("completion: %+v", c.Choices)
		}
		if c.Usage.PromptTokens != 2 || c.Usage.CompletionTokens != 12 || c.Usage.TotalTokens != 14 {
			t.Errorf("usage %+v", c.Usage)
		}
	})

	t.Run("completion stream with stop", func(t *testing.T) {
		stop := full[len(full)/2 : len(full)/2+3]
		want := full[:strings.Index(full, stop)]
		s := client.Completions.NewStreaming(ctx, openai.CompletionNewParams{
			Model:         testModel,
			Prompt:        openai.CompletionNewParamsPromptUnion{OfArrayOfTokens: []int64{1, textPromptLast}},
			MaxTokens:     openai.Int(12),
			Stop:          openai.CompletionNewParamsStopUnion{OfStringArray: []string{stop}},
			StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
		})
		var text strings.Builder
		finish := ""
		var completionTokens int64
		for s.Next() {
			c := s.Current()
			if len(c.Choices) > 0 {
				text.WriteString(c.Choices[0].Text)
				if c.Choices[0].FinishReason != "" {
					finish = string(c.Choices[0].FinishReason)
				}
			}
			if c.Usage.TotalTokens > 0 {
				completionTokens = c.Usage.CompletionTokens
			}
		}
		if err := s.Err(); err != nil {
			t.Fatal(err)
		}
		if text.String() != want || finish != "stop" || completionTokens == 0 || completionTokens > 12 {
			t.Errorf("text %q finish %q tokens %d; want %q stop", text.String(), finish, completionTokens, want)
		}
	})

	msgs := []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("You tell stories."), openai.UserMessage("Once upon a time")}
	t.Run("chat", func(t *testing.T) {
		c, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model: testModel, Messages: msgs, MaxCompletionTokens: openai.Int(5), Temperature: openai.Float(0),
			Logprobs: openai.Bool(true), TopLogprobs: openai.Int(2),
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(c.Choices) != 1 || c.Choices[0].Message.Role != "assistant" || c.Usage.CompletionTokens == 0 || c.Usage.CompletionTokens > 5 ||
			c.Usage.TotalTokens != c.Usage.PromptTokens+c.Usage.CompletionTokens {
			t.Fatalf("chat: %+v usage %+v", c.Choices, c.Usage)
		}
		if len(c.Choices[0].Logprobs.Content) == 0 || len(c.Choices[0].Logprobs.Content[0].TopLogprobs) != 2 {
			t.Errorf("chat logprobs: %+v", c.Choices[0].Logprobs)
		}
	})

	t.Run("chat stream", func(t *testing.T) {
		whole, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: testModel, Messages: msgs, MaxTokens: openai.Int(5)})
		if err != nil {
			t.Fatal(err)
		}
		s := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
			Model: testModel, Messages: msgs, MaxTokens: openai.Int(5),
			StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
		})
		var acc openai.ChatCompletionAccumulator
		for s.Next() {
			acc.AddChunk(s.Current())
		}
		if err := s.Err(); err != nil {
			t.Fatal(err)
		}
		if len(acc.Choices) != 1 || acc.Choices[0].Message.Content != whole.Choices[0].Message.Content ||
			acc.Choices[0].FinishReason != whole.Choices[0].FinishReason || acc.Usage.TotalTokens != whole.Usage.TotalTokens {
			t.Errorf("stream %+v usage %+v; whole %+v usage %+v", acc.Choices, acc.Usage, whole.Choices, whole.Usage)
		}
	})

	t.Run("errors", func(t *testing.T) {
		_, err := client.Completions.New(ctx, openai.CompletionNewParams{
			Model: testModel, Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("Hi")}, MaxTokens: openai.Int(100000),
		})
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Param != "max_tokens" || !strings.Contains(apiErr.Message, "got 100000") {
			t.Errorf("max_tokens: %v", err)
		}
		_, err = client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "gpt-4o", Messages: msgs})
		if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Code != "model_not_found" {
			t.Errorf("unknown model: %v", err)
		}
		bad := openai.NewClient(option.WithBaseURL(h.http.URL+"/v1/"), option.WithAPIKey("wrong"), option.WithMaxRetries(0))
		_, err = bad.Models.List(ctx)
		if !errors.As(err, &apiErr) || apiErr.StatusCode != 401 {
			t.Errorf("wrong key: %v", err)
		}
		models, err := client.Models.List(ctx)
		if err != nil || len(models.Data) != 1 || models.Data[0].ID != testModel {
			t.Errorf("models: %+v %v", models, err)
		}
	})
	h.waitIdle()
}

// TestOpenAISDKSchemaRefused: a strict schema outside the supported subset
// is a 400 the SDK surfaces with the parameter and the part named.
func TestOpenAISDKSchemaRefused(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	client := openai.NewClient(option.WithBaseURL(h.http.URL+"/v1/"), option.WithMaxRetries(0))
	_, err := client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
		Model:    testModel,
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
		ResponseFormat: openai.ChatCompletionNewParamsResponseFormatUnion{OfJSONSchema: &shared.ResponseFormatJSONSchemaParam{
			JSONSchema: shared.ResponseFormatJSONSchemaJSONSchemaParam{Name: "x", Strict: openai.Bool(true), Schema: map[string]any{
				"type": "object", "properties": map[string]any{"tags": map[string]any{"type": "array", "uniqueItems": true}},
			}},
		}},
	})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Param != "response_format" ||
		!strings.Contains(apiErr.Message, "#/properties/tags") || !strings.Contains(apiErr.Message, "uniqueItems") {
		t.Errorf("got %v", err)
	}
}
