package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
)

// progressGap is the pause between test_tool_with_progress's notifications.
// On a 2025-11-25 session with a GET stream, mcp-go splits them between that
// stream and the call's (flushWatch), and the client reads the two
// connections apart: the first event of the call's stream comes with its
// response head, which a loaded client takes longer to read. At 50 ms a
// notification on the call's stream came after the next one on the GET
// stream in about 1 call in 200 through capgate at load 15 to 25, which the
// suite fails as out of order (capgate drops the overtaken one, see
// sources/mcp/progress.go, and the suite then counts two).
const progressGap = 250 * time.Millisecond

// sendProgress sends one progress notification for token.
func sendProgress(ctx context.Context, s *server.MCPServer, token mcp.ProgressToken, progress, total int) error {
	err := s.SendNotificationToClient(ctx, string(mcp.MethodNotificationProgress),
		map[string]any{"progressToken": token, "progress": progress, "total": total})
	if err != nil {
		return fmt.Errorf("sending progress: %w", err)
	}
	return nil
}

// progressMarker is what the notification sendProgress sends for token and
// progress contains on the wire (encoding/json sorts a map's keys).
func progressMarker(token mcp.ProgressToken, progress int) string {
	tok, _ := json.Marshal(token)
	return `"progress":` + strconv.Itoa(progress) + `,"progressToken":` + string(tok)
}

// addBurstTool adds progress_burst, which is not the suite's: it sends its
// progress notifications back to back, as a busy tool does, so that on a
// 2025-11-25 session with a standalone GET stream mcp-go v1.2.1 splits them
// between that stream and the call's (see flushWatch). capgate's tests use
// it to check what a caller gets of such a split.
func addBurstTool(s *server.MCPServer) {
	s.AddTool(tool("progress_burst", "Reports progress 1 to count of count back to back when given a progress token",
		mcp.WithNumber("count", mcp.Description("how many notifications, 1 to 50 (mcp-go queues 100 a session)"))),
		func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			count := min(max(req.GetInt("count", 10), 1), 50)
			var token mcp.ProgressToken
			if req.Params.Meta != nil {
				token = req.Params.Meta.ProgressToken
			}
			if token == nil {
				return text("no progress token"), nil
			}
			for p := 1; p <= count; p++ {
				if err := sendProgress(ctx, s, token, p, count); err != nil {
					return nil, err
				}
			}
			// Every one is on the wire, on whichever stream, before the result.
			for p := 1; p <= count; p++ {
				if !awaitFlushed(ctx, progressMarker(token, p)) {
					return nil, ctx.Err()
				}
			}
			if !settle(ctx) {
				return nil, ctx.Err()
			}
			return text("sent " + strconv.Itoa(count)), nil
		})
}
