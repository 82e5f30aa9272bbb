package server

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	mcpsrc "github.com/capgate/capgate/sources/mcp"
)

// The error patch replaces mcp-go's answer to the request, as JSON (its
// held status following the upstream's error) or as the SSE event it is,
// and leaves every other message alone.
func TestErrorPatch(t *testing.T) {
	const mcpgoErr = `{"jsonrpc":"2.0","id":7,"error":{"code":-32603,"message":"MissingRequiredClientCapabilityError"}}`
	upstream := &mcpsrc.RPCError{Code: -32021, Message: "MissingRequiredClientCapabilityError",
		Data: map[string]any{"requiredCapabilities": map[string]any{"sampling": map[string]any{}}}, Status: 400}
	const want = `{"jsonrpc":"2.0","id":7,"error":{"code":-32021,"message":"MissingRequiredClientCapabilityError","data":{"requiredCapabilities":{"sampling":{}}}}}`
	newPatch := func(modern bool) (*errorPatch, *httptest.ResponseRecorder) {
		rec := httptest.NewRecorder()
		e := &errorPatch{w: rec, id: []byte("7"), modern: modern}
		e.upstream.Store(upstream)
		return e, rec
	}

	t.Run("JSON, stateless", func(t *testing.T) {
		e, rec := newPatch(true)
		e.Header().Set("Content-Type", "application/json")
		e.WriteHeader(http.StatusOK)
		e.Write([]byte(mcpgoErr + "\n"))
		e.release()
		if rec.Code != http.StatusBadRequest || rec.Body.String() != want+"\n" {
			t.Errorf("got %d %s, want 400 %s", rec.Code, rec.Body, want)
		}
	})
	t.Run("JSON, session", func(t *testing.T) {
		e, rec := newPatch(false)
		e.Header().Set("Content-Type", "application/json")
		e.WriteHeader(http.StatusOK)
		e.Write([]byte(mcpgoErr + "\n"))
		if rec.Code != http.StatusOK || rec.Body.String() != want+"\n" {
			t.Errorf("got %d %s, want 200 %s", rec.Code, rec.Body, want)
		}
	})
	t.Run("SSE after a notification", func(t *testing.T) {
		e, rec := newPatch(true)
		e.Header().Set("Content-Type", "text/event-stream")
		e.WriteHeader(http.StatusOK)
		progress := "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":\"p\",\"progress\":1}}\n\n"
		e.Write([]byte(progress))
		e.Flush()
		e.Write([]byte("event: message\ndata: " + mcpgoErr + "\n\n"))
		if got := rec.Body.String(); rec.Code != http.StatusOK || got != progress+"event: message\ndata: "+want+"\n\n" {
			t.Errorf("got %d\n%s", rec.Code, got)
		}
	})
	t.Run("another id", func(t *testing.T) {
		e, rec := newPatch(true)
		e.Header().Set("Content-Type", "application/json")
		other := strings.Replace(mcpgoErr, `"id":7`, `"id":8`, 1) + "\n"
		e.WriteHeader(http.StatusOK)
		e.Write([]byte(other))
		if rec.Body.String() != other {
			t.Errorf("an answer to another id was changed: %s", rec.Body)
		}
	})
	t.Run("resource not found", func(t *testing.T) {
		rec := httptest.NewRecorder()
		e := &errorPatch{w: rec, id: []byte(`"r"`), uri: "test://nope", modern: true}
		e.Header().Set("Content-Type", "application/json")
		e.WriteHeader(http.StatusBadRequest)
		e.Write([]byte(`{"jsonrpc":"2.0","id":"r","error":{"code":-32602,"message":"handler not found for resource URI 'test://nope': resource not found"}}` + "\n"))
		want := `{"jsonrpc":"2.0","id":"r","error":{"code":-32602,"message":"handler not found for resource URI 'test://nope': resource not found","data":{"uri":"test://nope"}}}` + "\n"
		if rec.Code != http.StatusBadRequest || rec.Body.String() != want {
			t.Errorf("got %d %s", rec.Code, rec.Body)
		}
	})
}
