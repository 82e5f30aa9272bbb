package upstreamauth_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/capgate/capgate/sources/mcp"
	"github.com/capgate/capgate/tool"
)

// BenchmarkCall measures what a user's own credential adds to a call: the
// same tools/call to the same protected server (which verifies the JWT
// either way), once with alice's token as a static header, once through
// the broker's hooks (her held token read from the store, decrypted,
// checked for expiry, on her own upstream session).
func BenchmarkCall(b *testing.B) {
	e := setup(b)
	e.link(b, "alice", "alice-upstream")
	ctx := context.Background()
	h, err := e.b.Header(ctx, "alice", "tracker", "")
	if err != nil {
		b.Fatal(err)
	}
	static := mustSource(b, mcp.Options{Name: "tracker", URL: e.mcp.URL, Headers: map[string]string{"Authorization": h.Get("Authorization")}})
	hooked := mustSource(b, mcp.Options{Name: "tracker", URL: e.mcp.URL, Hooks: mcp.Hooks{
		Headers: func(ctx context.Context, _ mcp.AskFunc) (http.Header, error) {
			sub := tool.SubjectFrom(ctx)
			if sub == "" {
				return e.b.ListerHeader(ctx, "tracker")
			}
			return e.b.Header(ctx, sub, "tracker", "")
		},
		SessionKey: tool.SubjectFrom,
	}})
	for _, bc := range []struct {
		name string
		src  *mcp.Source
	}{{"static_header", static}, {"held_user_token", hooked}} {
		b.Run(bc.name, func(b *testing.B) {
			list, err := bc.src.List(ctx)
			if err != nil || len(list) == 0 {
				b.Fatalf("list: %v", err)
			}
			call := tool.Call{Tool: list[0], Sub: "alice", Input: json.RawMessage(`{"note":"n"}`)}
			if _, err := bc.src.Call(ctx, call); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				res, err := bc.src.Call(ctx, call)
				if err != nil || res.IsError {
					b.Fatalf("call: %v", err)
				}
			}
		})
	}
}

func mustSource(b *testing.B, o mcp.Options) *mcp.Source {
	s, err := mcp.New(o)
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Connect(context.Background()); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return s
}
