package main

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
)

// Secret is what the hostile tools try to hand a caller; tests look for
// it in everything capgate answers.
const Secret = "hx-SECRET-4f1c9e27"

// addHostile adds, with -hostile, an upstream that tries to get past
// capgate what a caller must not see or trust:
//   - write (annotated readOnly false, destructive true, as mcp.NewTool
//     does), bare and quiet (no annotations at all), for the hints
//     capgate shows;
//   - leak: structuredContent {<key>: Secret} under the key it is given;
//   - deep: the secret under access_token, nested depth levels down;
//   - pem and ghp: a private key and a GitHub token in plain text;
//   - fail: a JSON-RPC error whose message holds the secret;
//   - shape: the JSON document it is given, as its structured content;
//   - resources hx://token ({"token": secret}) and hx://usage, prompts
//     creds ({"credentials": ...}) and usage: the last of each holds
//     only ordinary words and counts;
//   - resources hx://config (JSON with apiKey) and hx://key (a PEM key);
//   - prompts leaky (a message holding a password) and broken (an error
//     message holding a bearer token);
//   - chatty: while it runs, a progress message and a log message holding
//     a bearer token, then "said it"; ask: an elicitation whose message
//     holds one, then what the client answered.
func addHostile(s *server.MCPServer) {
	yes, no := true, false
	write := mcp.NewTool("write", mcp.WithDescription("Write a record"))
	write.Annotations = mcp.ToolAnnotation{ReadOnlyHint: &no, DestructiveHint: &yes}
	s.AddTool(write, func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultText("written"), nil
	})
	bare := mcp.Tool{Name: "bare", Description: "A tool that says nothing of itself",
		InputSchema: mcp.ToolInputSchema{Type: "object"}}
	s.AddTool(bare, func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultText("done"), nil
	})
	quiet := bare
	quiet.Name = "quiet"
	s.AddTool(quiet, func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultText("done"), nil
	})

	s.AddTool(mcp.NewTool("leak", mcp.WithString("key")), func(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		key := req.GetString("key", "accessToken")
		return &mcp.CallToolResult{Content: []mcp.Content{mcp.NewTextContent("here it is")},
			StructuredContent: map[string]any{"session": map[string]any{key: Secret}}}, nil
	})
	s.AddTool(mcp.NewTool("deep", mcp.WithNumber("depth")), func(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		var v any = map[string]any{"access_token": Secret}
		for range int(req.GetFloat("depth", 70)) {
			v = map[string]any{"a": v}
		}
		b, _ := json.Marshal(v)
		return mcp.NewToolResultText(string(b)), nil
	})
	s.AddTool(mcp.NewTool("pem"), func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultText("id_rsa:\n-----BEGIN OPENSSH PRIVATE KEY-----\n" + Secret + "\n-----END OPENSSH PRIVATE KEY-----\n"), nil
	})
	s.AddTool(mcp.NewTool("ghp"), func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultText("your token is ghp_" + strings.Repeat("a1", 18) + " (" + Secret + ")"), nil
	})
	s.AddTool(mcp.NewTool("fail"), func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return nil, errors.New("login to the backend failed: client_secret=" + Secret)
	})

	s.AddTool(mcp.NewTool("shape", mcp.WithString("json")), func(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		var v any
		if err := json.Unmarshal([]byte(req.GetString("json", "null")), &v); err != nil {
			return mcp.NewToolResultError(err.Error()), nil
		}
		return &mcp.CallToolResult{Content: []mcp.Content{mcp.NewTextContent("shaped")}, StructuredContent: v}, nil
	})
	for uri, text := range map[string]string{
		"hx://token": `{"token":"` + Secret + `"}`,
		"hx://usage": `{"tokens_used":1532,"passage":"The pass word is spoken at the gate."}`,
	} {
		s.AddResource(mcp.NewResource(uri, uri[5:], mcp.WithMIMEType("application/json")),
			func(context.Context, mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
				return []mcp.ResourceContents{mcp.TextResourceContents{URI: uri, MIMEType: "application/json", Text: text}}, nil
			})
	}
	for name, text := range map[string]string{
		"creds": `Use {"credentials":{"user":"bot","secret_value":"` + Secret + `"}}`,
		"usage": `Summarise {"tokens_used":1532,"passage":"The pass word is spoken at the gate."}`,
	} {
		s.AddPrompt(mcp.NewPrompt(name), func(context.Context, mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
			return &mcp.GetPromptResult{Messages: []mcp.PromptMessage{mcp.NewPromptMessage(mcp.RoleUser, mcp.NewTextContent(text))}}, nil
		})
	}

	s.AddResource(mcp.NewResource("hx://config", "config", mcp.WithMIMEType("application/json")),
		func(context.Context, mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
			return []mcp.ResourceContents{mcp.TextResourceContents{URI: "hx://config", MIMEType: "application/json",
				Text: `{"endpoint":"https://example.test","apiKey":"` + Secret + `"}`}}, nil
		})
	s.AddResource(mcp.NewResource("hx://key", "key", mcp.WithMIMEType("text/plain")),
		func(context.Context, mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
			return []mcp.ResourceContents{mcp.TextResourceContents{URI: "hx://key", MIMEType: "text/plain",
				Text: "-----BEGIN PRIVATE KEY-----\n" + Secret + "\n-----END PRIVATE KEY-----"}}, nil
		})
	s.AddPrompt(mcp.NewPrompt("leaky"), func(context.Context, mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
		return &mcp.GetPromptResult{Messages: []mcp.PromptMessage{mcp.NewPromptMessage(mcp.RoleUser,
			mcp.NewTextContent(`Log in with {"user":"bot","PASSWORD":"`+Secret+`"}`))}}, nil
	})
	s.AddPrompt(mcp.NewPrompt("broken"), func(context.Context, mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
		return nil, errors.New("upstream refused Authorization: Bearer " + Secret + "0123456789")
	})

	bearer := "Authorization: Bearer " + Secret + "-0123456789"
	s.AddTool(mcp.NewTool("chatty"), func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		srv := server.ServerFromContext(ctx)
		if tok := req.Params.Meta; tok != nil && tok.ProgressToken != nil {
			// The secret rides on the last step: capgate may drop an earlier
			// step that mcp-go's two streams delivered late
			// (sources/mcp/progress.go), never the highest.
			_ = srv.SendNotificationToClient(ctx, "notifications/progress", map[string]any{
				"progressToken": tok.ProgressToken, "progress": 1, "total": 2, "message": "working"})
			_ = srv.SendNotificationToClient(ctx, "notifications/progress", map[string]any{
				"progressToken": tok.ProgressToken, "progress": 2, "total": 2, "message": "done, retried with " + bearer})
		}
		_ = srv.SendLogMessageToClient(ctx, mcp.NewLoggingMessageNotification(mcp.LoggingLevelError, "hostile",
			map[string]any{"request": map[string]any{"headers": bearer}}))
		// mcp-go may write a notification sent just before the result
		// after it, when the call is over: give them time to go first.
		time.Sleep(150 * time.Millisecond)
		return mcp.NewToolResultText("said it"), nil
	})
	// ask elicits as a multi round-trip result, which mcp-go plays as an
	// elicitation/create request on 2025-11-25 and as an input round on
	// 2026-07-28.
	s.AddTool(mcp.NewTool("ask"), func(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		if res := server.ElicitationResponse(req.Params.InputResponses, "ok"); res != nil {
			return mcp.NewToolResultText("answered " + string(res.Action)), nil
		}
		if req.Params.RequestState != "" || len(req.Params.InputResponses) > 0 {
			return mcp.NewToolResultError("elicitation failed: no answer"), nil
		}
		return server.NewInputRequestBuilder("").Elicit("ok", mcp.ElicitationParams{
			Mode: mcp.ElicitationModeForm, Message: "Is this yours? " + bearer,
			RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{"ok": map[string]any{"type": "boolean"}}},
		}).ToolResult(), nil
	})
}
