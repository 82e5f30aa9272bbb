// Command corpusfixture is an upstream MCP server (stdio, mcp-go) that
// lists the tools of one file of toolsearch's corpus (-corpus FILE): real
// public servers' names, descriptions and input schemas. Calling a tool
// answers "ran NAME ARGUMENTS", so a test sees which tool ran with what.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"log"
	"os"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
)

func main() {
	file := flag.String("corpus", "", "a toolsearch/testdata/corpus file")
	flag.Parse()
	b, err := os.ReadFile(*file)
	if err != nil {
		log.Fatal(err)
	}
	var c struct {
		Server string `json:"server"`
		Tools  []struct {
			Name        string          `json:"name"`
			Description string          `json:"description"`
			InputSchema json.RawMessage `json:"inputSchema"`
		} `json:"tools"`
	}
	if err := json.Unmarshal(b, &c); err != nil {
		log.Fatalf("%s: %v", *file, err)
	}
	s := server.NewMCPServer(c.Server, "1", server.WithToolCapabilities(false))
	for _, t := range c.Tools {
		s.AddTool(mcp.NewToolWithRawSchema(t.Name, t.Description, t.InputSchema),
			func(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				args, _ := json.Marshal(req.GetArguments())
				return mcp.NewToolResultText("ran " + req.Params.Name + " " + string(args)), nil
			})
	}
	if err := server.ServeStdio(s); err != nil {
		log.Fatal(err)
	}
}
