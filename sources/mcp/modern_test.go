package mcp

import (
	"context"
	"encoding/json"
	"testing"

	mcpgo "github.com/mark3labs/mcp-go/mcp"

	"github.com/capgate/capgate/tool"
)

// TestMetaForDeclaresOnlyTheCallersCapabilities: a stateless request tells
// the upstream, of the capabilities capgate relays, only what the calling
// client declared; nothing for a caller that can be asked nothing; all of
// them for capgate's own requests, made for no client.
func TestMetaForDeclaresOnlyTheCallersCapabilities(t *testing.T) {
	caps := func(meta []byte) map[string]json.RawMessage {
		t.Helper()
		var m map[string]json.RawMessage
		if err := json.Unmarshal(append(append([]byte{'{'}, meta...), '}'), &m); err != nil {
			t.Fatalf("%s: %v", meta, err)
		}
		if string(m[mcpgo.MetaKeyProtocolVersion]) != `"`+Modern+`"` {
			t.Errorf("protocol version %s", m[mcpgo.MetaKeyProtocolVersion])
		}
		var c map[string]json.RawMessage
		if err := json.Unmarshal(m[mcpgo.MetaKeyClientCapabilities], &c); err != nil {
			t.Fatalf("%s: %v", meta, err)
		}
		return c
	}
	ctx := tool.WithAskable(context.Background(), json.RawMessage(`{"sampling":{},"experimental":{"x":{}},"roots":null}`))
	if c := caps(metaFor(ctx, true)); len(c) != 1 || string(c["sampling"]) != "{}" {
		t.Errorf("a client that declared sampling (and more capgate does not relay): upstream told %v", c)
	}
	if c := caps(metaFor(ctx, false)); len(c) != 0 {
		t.Errorf("a caller that can be asked nothing: upstream told %v", c)
	}
	if c := caps(metaFor(context.Background(), true)); c["sampling"] == nil || c["elicitation"] == nil || c["roots"] == nil {
		t.Errorf("capgate's own request: upstream told %v, want every capability capgate relays", c)
	}
}
