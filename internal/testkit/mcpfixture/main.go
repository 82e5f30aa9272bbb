// Command mcpfixture is an upstream MCP server for tests, built on mcp-go:
// over stdio by default, over streamable HTTP with -http ADDR (path /mcp),
// over the SSE transport with -sse ADDR (/sse).
//
// Tools: echo (a raw input schema with top-level keywords clients must
// keep), slow (progress notifications, then a result; cancellation is
// written to $FIXTURE_CANCEL_FILE), mutate (changes echo's description,
// which lists as changed), and filler tools t_00..t_24 so that tools/list
// takes several pages. With -hostile it serves instead the hostile
// upstream of hostile.go, over stdio.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
)

// EchoSchema is echo's input schema, byte for byte.
const EchoSchema = `{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object","title":"Echo input","additionalProperties":false,"properties":{"message":{"type":"string","minLength":1}},"required":["message"]}`

func main() {
	addr := flag.String("http", "", "serve streamable HTTP on this address instead of stdio")
	sseAddr := flag.String("sse", "", "serve the SSE transport (/sse, /message) on this address instead of stdio")
	hostile := flag.Bool("hostile", false, "serve only the hostile tools, resources and prompts of hostile.go")
	flag.Parse()

	if *hostile {
		s := server.NewMCPServer("mcpfixture-hostile", "1.0.0", server.WithToolCapabilities(true),
			server.WithResourceCapabilities(false, false), server.WithPromptCapabilities(false))
		addHostile(s)
		if err := server.ServeStdio(s); err != nil {
			log.Fatal(err)
		}
		return
	}
	s := server.NewMCPServer("mcpfixture", "1.0.0",
		server.WithToolCapabilities(true), server.WithPaginationLimit(10))
	yes, no := true, false
	echo := func(desc string) mcp.Tool {
		t := mcp.NewToolWithRawSchema("echo", desc, json.RawMessage(EchoSchema))
		t.Annotations = mcp.ToolAnnotation{ReadOnlyHint: &yes, DestructiveHint: &no, OpenWorldHint: &no}
		return t
	}
	echoHandler := func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		msg, _ := req.GetArguments()["message"].(string)
		return &mcp.CallToolResult{
			Content:           []mcp.Content{mcp.NewTextContent("echo: " + msg)},
			StructuredContent: map[string]any{"message": msg},
		}, nil
	}
	s.AddTool(echo("Echo a message"), echoHandler)

	slow := mcp.NewTool("slow", mcp.WithDescription("Report progress three times, then answer"),
		mcp.WithNumber("delay_ms", mcp.Description("pause between steps")))
	s.AddTool(slow, func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		delay := time.Duration(req.GetFloat("delay_ms", 10)) * time.Millisecond
		var token mcp.ProgressToken
		if req.Params.Meta != nil {
			token = req.Params.Meta.ProgressToken
		}
		for i := 1; i <= 3; i++ {
			if token != nil {
				_ = server.ServerFromContext(ctx).SendNotificationToClient(ctx, "notifications/progress",
					map[string]any{"progressToken": token, "progress": i, "total": 3, "message": fmt.Sprintf("step %d", i)})
			}
			select {
			case <-ctx.Done():
				if f := os.Getenv("FIXTURE_CANCEL_FILE"); f != "" {
					_ = os.WriteFile(f, []byte("cancelled"), 0o644)
				}
				return nil, ctx.Err()
			case <-time.After(delay):
			}
		}
		return mcp.NewToolResultText("done"), nil
	})

	s.AddTool(mcp.NewTool("mutate", mcp.WithDescription("Change echo's description")),
		func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			s.AddTool(echo("Echo a message, and keep a copy"), echoHandler)
			return mcp.NewToolResultText("mutated"), nil
		})

	for i := range 25 {
		s.AddTool(mcp.NewTool(fmt.Sprintf("t_%02d", i), mcp.WithDescription("Filler tool")),
			func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				return mcp.NewToolResultText("ok"), nil
			})
	}

	if *sseAddr != "" {
		log.Fatal(server.NewSSEServer(s, server.WithBaseURL("http://"+*sseAddr)).Start(*sseAddr))
	}
	if *addr == "" {
		if err := server.ServeStdio(s); err != nil {
			log.Fatal(err)
		}
		return
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", server.NewStreamableHTTPServer(s))
	log.Fatal(http.ListenAndServe(*addr, mux))
}
