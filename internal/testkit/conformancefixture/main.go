// Command conformancefixture is an upstream MCP server, built on mcp-go, that
// implements what the MCP conformance suite (@modelcontextprotocol/conformance,
// server mode) expects of the server under test: its fixture tools,
// resources, resource template, prompts, completion, logging, subscriptions,
// progress, sampling and elicitation.
//
// It serves stdio by default and streamable HTTP at /mcp with -http ADDR.
//
// Sampling and elicitation are written as multi round-trip handlers
// (server.NewInputRequestBuilder): a client on protocol 2026-07-28 gets an
// input_required result and retries, and mcp-go turns the same handler into
// server-initiated sampling/createMessage and elicitation/create requests
// for a client on 2025-11-25 or earlier, which is what the suite speaks.
//
// Every tool is annotated as read-only, non-destructive, idempotent and
// closed-world (mcp.NewTool's defaults say the opposite), because that is
// what they are.
package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"log"
	"net/http"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
)

// Fixture texts the suite checks for (or that its descriptions prescribe).
const (
	simpleText          = "This is a simple text response for testing."
	errorText           = "This tool intentionally returns an error for testing"
	embeddedText        = "This is an embedded resource content."
	staticText          = "This is the content of the static text resource."
	watchedText         = "This resource is watched by the subscription tests."
	promptEmbeddedText  = "Embedded resource content for testing."
	jsonSchema2020Tool  = "json_schema_2020_12_tool"
	jsonSchema2020Input = `{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object","$defs":{"address":{"type":"object","properties":{"street":{"type":"string"},"city":{"type":"string"}}}},"properties":{"name":{"type":"string"},"address":{"$ref":"#/$defs/address"}},"additionalProperties":false}`
)

// pngBase64 is a 1x1 red PNG and wavBase64 a short silent 8 kHz mono WAV,
// both made at start-up.
var pngBase64, wavBase64 = makePNG(), makeWAV()

func main() {
	addr := flag.String("http", "", "serve streamable HTTP at /mcp on this address instead of stdio")
	flag.Parse()

	s := newServer()
	if *addr == "" {
		if err := server.ServeStdio(s); err != nil {
			log.Fatal(err)
		}
		return
	}

	mux := http.NewServeMux()
	// The event store is not only for resumability: without one, mcp-go
	// v1.2.1 can drop a notification sent just before a tool returns (its
	// forwarder takes it off the channel and then sees the request done),
	// which loses the last progress or log message now and then.
	mux.Handle("/mcp", watchFlushes(server.NewStreamableHTTPServer(s, server.WithEventStore(server.NewInMemoryEventStore()),
		server.WithHTTPContextFunc(listenStreams))))
	srv := &http.Server{Addr: *addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Fatal(err)
	}
}

func newServer() *server.MCPServer {
	hooks := &server.Hooks{}
	hookSubscriptions(hooks)
	s := server.NewMCPServer("conformancefixture", "1.0.0",
		server.WithHooks(hooks),
		server.WithToolCapabilities(true),
		server.WithResourceCapabilities(true, true),
		server.WithPromptCapabilities(true),
		server.WithLogging(),
		server.WithCompletions(),
		server.WithElicitation(),
		server.WithPromptCompletionProvider(completer{}),
		server.WithResourceCompletionProvider(completer{}),
	)
	s.EnableSampling()
	addTools(s)
	addWatchTools(s)
	addBurstTool(s)
	addResources(s)
	addPrompts(s)
	return s
}

// tool makes a tool with honest annotations: the fixture's tools read nothing
// and change nothing outside themselves.
func tool(name, description string, opts ...mcp.ToolOption) mcp.Tool {
	opts = append([]mcp.ToolOption{
		mcp.WithDescription(description),
		mcp.WithReadOnlyHintAnnotation(true),
		mcp.WithDestructiveHintAnnotation(false),
		mcp.WithIdempotentHintAnnotation(true),
		mcp.WithOpenWorldHintAnnotation(false),
	}, opts...)
	return mcp.NewTool(name, opts...)
}

func text(s string) *mcp.CallToolResult { return mcp.NewToolResultText(s) }

func content(c ...mcp.Content) *mcp.CallToolResult { return &mcp.CallToolResult{Content: c} }

func addTools(s *server.MCPServer) {
	s.AddTool(tool("test_simple_text", "Returns a simple text response"),
		func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return text(simpleText), nil
		})
	s.AddTool(tool("test_image_content", "Returns a 1x1 red PNG image"),
		func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return content(mcp.NewImageContent(pngBase64, "image/png")), nil
		})
	s.AddTool(tool("test_audio_content", "Returns a short WAV audio clip"),
		func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return content(mcp.NewAudioContent(wavBase64, "audio/wav")), nil
		})
	s.AddTool(tool("test_embedded_resource", "Returns an embedded text resource"),
		func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return content(mcp.NewEmbeddedResource(mcp.TextResourceContents{
				URI: "test://embedded-resource", MIMEType: "text/plain", Text: embeddedText,
			})), nil
		})
	s.AddTool(tool("test_multiple_content_types", "Returns text, image and embedded resource content"),
		func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return content(
				mcp.NewTextContent("Multiple content types test:"),
				mcp.NewImageContent(pngBase64, "image/png"),
				mcp.NewEmbeddedResource(mcp.TextResourceContents{
					URI: "test://mixed-content-resource", MIMEType: "application/json", Text: `{"test":"data","value":123}`,
				}),
			), nil
		})
	s.AddTool(tool("test_error_handling", "Always fails with a tool error"),
		func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultError(errorText), nil
		})

	s.AddTool(tool("test_tool_with_logging", "Sends three info log notifications while it runs"),
		func(ctx context.Context, _ mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			for i, msg := range []string{"Tool execution started", "Tool processing data", "Tool execution completed"} {
				if i > 0 && !sleep(ctx, 50*time.Millisecond) {
					return nil, ctx.Err()
				}
				// SendLogMessageToClient honours logging/setLevel (2025-11-25)
				// and the per-request log level (2026-07-28).
				err := s.SendLogMessageToClient(ctx, mcp.NewLoggingMessageNotification(mcp.LoggingLevelInfo, "conformancefixture", msg))
				if err != nil {
					return nil, fmt.Errorf("sending log message: %w", err)
				}
			}
			if !settle(ctx) {
				return nil, ctx.Err()
			}
			return text("Tool with logging executed successfully"), nil
		})

	s.AddTool(tool("test_tool_with_progress", "Reports progress 0, 50 and 100 of 100 when given a progress token"),
		func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			var token mcp.ProgressToken
			if req.Params.Meta != nil {
				token = req.Params.Meta.ProgressToken
			}
			for i, p := range []int{0, 50, 100} {
				if i > 0 && !sleep(ctx, progressGap) {
					return nil, ctx.Err()
				}
				if token == nil {
					continue
				}
				if err := sendProgress(ctx, s, token, p, 100); err != nil {
					return nil, err
				}
				// The suite fails the scenario unless the three arrive in
				// order and before the result: each is on the wire before
				// the next is queued (flushed.go says why this matters),
				// and the result waits for the last, then settles.
				if !awaitFlushed(ctx, progressMarker(token, p)) {
					return nil, ctx.Err()
				}
			}
			if token != nil && !settle(ctx) {
				return nil, ctx.Err()
			}
			return text("Tool with progress executed successfully"), nil
		})

	s.AddTool(tool("test_sampling", "Asks the client's LLM to answer a prompt",
		mcp.WithString("prompt", mcp.Required(), mcp.Description("The prompt to send to the LLM"))),
		func(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			if res := server.SamplingResponse(req.Params.InputResponses, "sample"); res != nil {
				return text("LLM response: " + samplingText(res)), nil
			}
			return server.NewInputRequestBuilder("").Sample("sample", mcp.CreateMessageParams{
				Messages: []mcp.SamplingMessage{{
					Role: mcp.RoleUser, Content: mcp.NewTextContent(req.GetString("prompt", "")),
				}},
				MaxTokens: 100,
			}).ToolResult(), nil
		})

	elicit := func(name, description, message string, schema map[string]any, prefix string, opts ...mcp.ToolOption) {
		s.AddTool(tool(name, description, opts...),
			func(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				if res := server.ElicitationResponse(req.Params.InputResponses, "elicit"); res != nil {
					b, _ := json.Marshal(res.Content)
					return text(fmt.Sprintf("%saction=%s, content=%s", prefix, res.Action, b)), nil
				}
				msg := req.GetString("message", message)
				return server.NewInputRequestBuilder("").Elicit("elicit", mcp.ElicitationParams{
					Mode: mcp.ElicitationModeForm, Message: msg, RequestedSchema: schema,
				}).ToolResult(), nil
			})
	}
	elicit("test_elicitation", "Asks the user for a username and an email address", "",
		map[string]any{
			"type": "object",
			"properties": map[string]any{
				"username": map[string]any{"type": "string", "description": "User's response"},
				"email":    map[string]any{"type": "string", "description": "User's email address"},
			},
			"required": []string{"username", "email"},
		}, "User response: ",
		mcp.WithString("message", mcp.Required(), mcp.Description("The message to show the user")))
	elicit("test_elicitation_sep1034_defaults", "Elicits every primitive type with a default value (SEP-1034)",
		"Please review your information",
		map[string]any{
			"type": "object",
			"properties": map[string]any{
				"name":     map[string]any{"type": "string", "description": "Your name", "default": "John Doe"},
				"age":      map[string]any{"type": "integer", "description": "Your age", "default": 30},
				"score":    map[string]any{"type": "number", "description": "Your score", "default": 95.5},
				"status":   map[string]any{"type": "string", "description": "Your status", "enum": []string{"active", "inactive", "pending"}, "default": "active"},
				"verified": map[string]any{"type": "boolean", "description": "Verified", "default": true},
			},
		}, "Elicitation completed: ")
	titled := func(prefix string, titles ...string) []any {
		var out []any
		for i, t := range titles {
			out = append(out, map[string]any{"const": fmt.Sprintf("%s%d", prefix, i+1), "title": t})
		}
		return out
	}
	elicit("test_elicitation_sep1330_enums", "Elicits all five enum schema variants (SEP-1330)",
		"Please choose your options",
		map[string]any{
			"type": "object",
			"properties": map[string]any{
				"untitledSingle": map[string]any{"type": "string", "enum": []string{"option1", "option2", "option3"}},
				"titledSingle":   map[string]any{"type": "string", "oneOf": titled("value", "First Option", "Second Option", "Third Option")},
				"legacyEnum": map[string]any{"type": "string", "enum": []string{"opt1", "opt2", "opt3"},
					"enumNames": []string{"Option One", "Option Two", "Option Three"}},
				"untitledMulti": map[string]any{"type": "array",
					"items": map[string]any{"type": "string", "enum": []string{"option1", "option2", "option3"}}},
				"titledMulti": map[string]any{"type": "array",
					"items": map[string]any{"anyOf": titled("value", "First Choice", "Second Choice", "Third Choice")}},
			},
		}, "Elicitation completed: ")

	// refuse_after_input is not the suite's: it asks, then fails the call
	// with a JSON-RPC error (mcp-go's -32603 with its message), an
	// upstream error on a later round for capgate's replica tests.
	s.AddTool(tool("refuse_after_input", "Asks for a name, then refuses the call"),
		func(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			if res := server.ElicitationResponse(req.Params.InputResponses, "name"); res != nil {
				return nil, fmt.Errorf("refused after input (%s)", res.Action)
			}
			return server.NewInputRequestBuilder("").Elicit("name", mcp.ElicitationParams{
				Mode: mcp.ElicitationModeForm, Message: "Your name?",
				RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{"name": map[string]any{"type": "string"}}},
			}).ToolResult(), nil
		})

	// A raw schema must not come with mcp.NewTool's InputSchema as well.
	schemaTool := mcp.NewToolWithRawSchema(jsonSchema2020Tool, "Tool with JSON Schema 2020-12 features",
		json.RawMessage(jsonSchema2020Input))
	schemaTool.Annotations = tool("", "").Annotations
	s.AddTool(schemaTool,
		func(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			b, _ := json.Marshal(req.GetArguments())
			return text("Received: " + string(b)), nil
		})

	// test_reconnection is the suite's SSE polling (SEP-1699) probe: it should
	// close the POST's SSE stream mid-call and let the client resume with
	// Last-Event-ID. mcp-go has no way to close a stream on purpose, so the
	// tool just answers after a short pause.
	s.AddTool(tool("test_reconnection", "Answers after a short pause (SSE polling probe)"),
		func(ctx context.Context, _ mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			if !sleep(ctx, 100*time.Millisecond) {
				return nil, ctx.Err()
			}
			return text("Reconnection test completed"), nil
		})
}

func samplingText(res *mcp.CreateMessageResult) string {
	switch c := res.Content.(type) {
	case mcp.TextContent:
		return c.Text
	case *mcp.TextContent:
		return c.Text
	case map[string]any:
		if t, ok := c["text"].(string); ok {
			return t
		}
	}
	b, _ := json.Marshal(res.Content)
	return string(b)
}

// settle pauses after a tool's last notification, before it returns, for
// two races that otherwise lose that notification now and then:
//
//   - mcp-go v1.2.1's streamable HTTP server: its forwarder can take the
//     notification off the session's channel and then, finding the request
//     done, drop it (with an event store, which the -http server has, only
//     for requests on protocol 2026-07-28, which never use the store);
//   - the suite's TypeScript client hands notifications to their handlers a
//     microtask late but drops a request's progress handler as soon as its
//     response is parsed, so a progress notification that arrives in the
//     same read as the response is lost.
func settle(ctx context.Context) bool { return sleep(ctx, 100*time.Millisecond) }

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func addResources(s *server.MCPServer) {
	static := func(uri, name, description, mime string, c mcp.ResourceContents) {
		s.AddResource(mcp.NewResource(uri, name, mcp.WithResourceDescription(description), mcp.WithMIMEType(mime)),
			func(context.Context, mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
				return []mcp.ResourceContents{c}, nil
			})
	}
	static("test://static-text", "static-text", "A static text resource", "text/plain",
		mcp.TextResourceContents{URI: "test://static-text", MIMEType: "text/plain", Text: staticText})
	static("test://static-binary", "static-binary", "A static binary resource (a 1x1 PNG)", "image/png",
		mcp.BlobResourceContents{URI: "test://static-binary", MIMEType: "image/png", Blob: pngBase64})
	static("test://watched-resource", "watched-resource", "A resource to subscribe to", "text/plain",
		mcp.TextResourceContents{URI: "test://watched-resource", MIMEType: "text/plain", Text: watchedText})

	s.AddResourceTemplate(mcp.NewResourceTemplate("test://template/{id}/data", "template-data",
		mcp.WithTemplateDescription("Data for an id, substituted from the URI"), mcp.WithTemplateMIMEType("application/json")),
		func(_ context.Context, req mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
			id := strings.TrimSuffix(strings.TrimPrefix(req.Params.URI, "test://template/"), "/data")
			b, _ := json.Marshal(map[string]any{"id": id, "templateTest": true, "data": "Data for ID: " + id})
			return []mcp.ResourceContents{mcp.TextResourceContents{URI: req.Params.URI, MIMEType: "application/json", Text: string(b)}}, nil
		})
}

func addPrompts(s *server.MCPServer) {
	msgs := func(m ...mcp.PromptMessage) *mcp.GetPromptResult { return &mcp.GetPromptResult{Messages: m} }
	s.AddPrompt(mcp.NewPrompt("test_simple_prompt", mcp.WithPromptDescription("A simple prompt without arguments")),
		func(context.Context, mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
			return msgs(mcp.NewPromptMessage(mcp.RoleUser, mcp.NewTextContent("This is a simple prompt for testing."))), nil
		})
	s.AddPrompt(mcp.NewPrompt("test_prompt_with_arguments", mcp.WithPromptDescription("A prompt with two required arguments"),
		mcp.WithArgument("arg1", mcp.ArgumentDescription("First test argument"), mcp.RequiredArgument()),
		mcp.WithArgument("arg2", mcp.ArgumentDescription("Second test argument"), mcp.RequiredArgument())),
		func(_ context.Context, req mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
			a := req.Params.Arguments
			return msgs(mcp.NewPromptMessage(mcp.RoleUser, mcp.NewTextContent(
				fmt.Sprintf("Prompt with arguments: arg1='%s', arg2='%s'", a["arg1"], a["arg2"])))), nil
		})
	s.AddPrompt(mcp.NewPrompt("test_prompt_with_embedded_resource", mcp.WithPromptDescription("A prompt with an embedded resource"),
		mcp.WithArgument("resourceUri", mcp.ArgumentDescription("URI of the resource to embed"), mcp.RequiredArgument())),
		func(_ context.Context, req mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
			return msgs(
				mcp.NewPromptMessage(mcp.RoleUser, mcp.NewEmbeddedResource(mcp.TextResourceContents{
					URI: req.Params.Arguments["resourceUri"], MIMEType: "text/plain", Text: promptEmbeddedText,
				})),
				mcp.NewPromptMessage(mcp.RoleUser, mcp.NewTextContent("Please process the embedded resource above.")),
			), nil
		})
	// Needs the user's context first (SEP-2322), under a state of its own
	// that must come back as it went: what capgate relays in rounds.
	s.AddPrompt(mcp.NewPrompt("test_prompt_needs_input", mcp.WithPromptDescription("A prompt that asks the user for context first")),
		func(_ context.Context, req mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
			if res := server.ElicitationResponse(req.Params.InputResponses, "context"); res != nil && req.Params.RequestState == "fixture-prompt-state" {
				b, _ := json.Marshal(res.Content)
				return msgs(mcp.NewPromptMessage(mcp.RoleUser, mcp.NewTextContent("Context: "+string(b)))), nil
			}
			return server.NewInputRequestBuilder("fixture-prompt-state").Elicit("context", mcp.ElicitationParams{
				Mode: mcp.ElicitationModeForm, Message: "What context should the prompt use?",
				RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{"context": map[string]any{"type": "string"}}},
			}).PromptResult(), nil
		})
	s.AddPrompt(mcp.NewPrompt("test_prompt_with_image", mcp.WithPromptDescription("A prompt with an image")),
		func(context.Context, mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
			return msgs(
				mcp.NewPromptMessage(mcp.RoleUser, mcp.NewImageContent(pngBase64, "image/png")),
				mcp.NewPromptMessage(mcp.RoleUser, mcp.NewTextContent("Please analyze the image above.")),
			), nil
		})
}

// completer completes test_prompt_with_arguments' arguments and the
// template's id from small fixed lists, by prefix.
type completer struct{}

var completions = map[string][]string{
	"arg1":        {"paris", "park", "party", "test", "testValue1"},
	"arg2":        {"world", "testValue2"},
	"resourceUri": {"test://static-text", "test://static-binary"},
	"id":          {"1", "123", "42"},
}

func complete(arg mcp.CompleteArgument) *mcp.Completion {
	values := []string{}
	for _, v := range completions[arg.Name] {
		if strings.HasPrefix(v, arg.Value) {
			values = append(values, v)
		}
	}
	sort.Strings(values)
	return &mcp.Completion{Values: values, Total: len(values)}
}

func (completer) CompletePromptArgument(_ context.Context, _ string, arg mcp.CompleteArgument, _ mcp.CompleteContext) (*mcp.Completion, error) {
	return complete(arg), nil
}

func (completer) CompleteResourceArgument(_ context.Context, _ string, arg mcp.CompleteArgument, _ mcp.CompleteContext) (*mcp.Completion, error) {
	return complete(arg), nil
}

func makePNG() string {
	img := image.NewRGBA(image.Rect(0, 0, 1, 1))
	img.Set(0, 0, color.RGBA{R: 255, A: 255})
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		panic(err)
	}
	return base64.StdEncoding.EncodeToString(b.Bytes())
}

func makeWAV() string {
	const rate, samples = 8000, 80 // 10 ms of 8-bit silence
	var b bytes.Buffer
	w := func(v any) { _ = binary.Write(&b, binary.LittleEndian, v) }
	b.WriteString("RIFF")
	w(uint32(36 + samples))
	b.WriteString("WAVEfmt ")
	w(uint32(16))   // fmt chunk size
	w(uint16(1))    // PCM
	w(uint16(1))    // mono
	w(uint32(rate)) // sample rate
	w(uint32(rate)) // byte rate
	w(uint16(1))    // block align
	w(uint16(8))    // bits per sample
	b.WriteString("data")
	w(uint32(samples))
	b.Write(bytes.Repeat([]byte{128}, samples))
	return base64.StdEncoding.EncodeToString(b.Bytes())
}
