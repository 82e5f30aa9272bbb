package mcp

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"testing"
	"time"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/capgate/capgate/tool"
)

// TestTimeoutWithoutCallerDeadline: a call whose caller set no deadline
// still ends at the source's timeout, with capability_backend_unavailable,
// as CallTimeout promises the router (which then sets no timer of its own).
func TestTimeoutWithoutCallerDeadline(t *testing.T) {
	up := mcpserver.NewMCPServer("hangs", "1")
	release := make(chan struct{})
	up.AddTool(mcpgo.NewTool("hang"), func(ctx context.Context, _ mcpgo.CallToolRequest) (*mcpgo.CallToolResult, error) {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return mcpgo.NewToolResultText("late"), nil
	})
	srv := httptest.NewServer(mcpserver.NewStreamableHTTPServer(up))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })
	s := connect(t, Options{Name: "hangs", URL: srv.URL + "/mcp", Protocol: Protocol, Timeout: 300 * time.Millisecond})
	if got := s.CallTimeout(); got != 300*time.Millisecond {
		t.Fatalf("CallTimeout %v, want the configured 300ms", got)
	}
	ds, err := s.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Call(context.Background(), tool.Call{Tool: find(t, ds, "hang"), Input: json.RawMessage(`{}`)})
	if tool.ErrorCode(err) != tool.CodeBackendUnavailable {
		t.Fatalf("a call past the source's timeout: %v, want %s", err, tool.CodeBackendUnavailable)
	}
}
