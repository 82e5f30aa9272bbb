package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/capgate/capgate/internal/testkit"
	"github.com/capgate/capgate/sources"
	srcmcp "github.com/capgate/capgate/sources/mcp"
	"github.com/capgate/capgate/token"
)

// burstN is how many log messages, and as many progress notifications,
// the burst upstream sends before its result.
const burstN = 3

// eventCount counts the SSE events an mcp-go response has written, so
// that the burst tool answers only once its notifications are on the
// wire: mcp-go v1.2.1 (as an upstream) can drop one sent just before its
// handler returns, and this test is about capgate's order, not mcp-go's.
type eventCount struct {
	http.ResponseWriter
	mu      sync.Mutex
	n       int
	changed chan struct{}
}

type eventCountKey struct{}

func (c *eventCount) Write(p []byte) (int, error) {
	n, err := c.ResponseWriter.Write(p)
	c.mu.Lock()
	c.n += bytes.Count(p, []byte("event: message\n"))
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
	return n, err
}

func (c *eventCount) Flush() { c.ResponseWriter.(http.Flusher).Flush() }

func (c *eventCount) Unwrap() http.ResponseWriter { return c.ResponseWriter }

// await waits until n events are written, or ctx ends.
func (c *eventCount) await(ctx context.Context, n int) {
	for {
		c.mu.Lock()
		done, changed := c.n >= n, c.changed
		c.mu.Unlock()
		if done {
			return
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return
		}
	}
}

// orderUpstream is an mcp-go server on a loopback port (url) with two
// tools. burst sends log message i and progress i for i = 1..burstN at
// once, and answers as soon as they have left. asks sends a log message,
// then asks its client to confirm (elicitation, on a 2025-11-25 session)
// and, once told on speak, sends another, then says so on spoke; it
// answers once confirmed.
// It offers no standalone stream (GET is 405), so that on a 2025-11-25
// session all a call sends goes on the call's own stream, as the
// reference server does (mcp-go would put some on the standalone one).
type orderUpstream struct {
	url          string
	speak, spoke chan struct{}
}

func newOrderUpstream(t *testing.T) *orderUpstream {
	t.Helper()
	u := &orderUpstream{speak: make(chan struct{}), spoke: make(chan struct{})}
	s := mcpserver.NewMCPServer("order", "1.0.0", mcpserver.WithToolCapabilities(false), mcpserver.WithLogging(), mcpserver.WithElicitation())
	s.AddTool(mcp.NewTool("burst", mcp.WithDescription("Send log messages and progress, then answer at once"),
		mcp.WithReadOnlyHintAnnotation(true), mcp.WithDestructiveHintAnnotation(false), mcp.WithOpenWorldHintAnnotation(false)),
		func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			var token mcp.ProgressToken
			if req.Params.Meta != nil {
				token = req.Params.Meta.ProgressToken
			}
			// On 2026-07-28 the request names a level; a session's was set.
			info := mcpserver.RequestProtocolInfoFromContext(ctx)
			logs := info == nil || !info.Modern || info.LogLevel != ""
			sent := 0
			for i := 1; i <= burstN; i++ {
				if logs {
					if err := s.SendLogMessageToClient(ctx, mcp.NewLoggingMessageNotification(mcp.LoggingLevelInfo, "burst", fmt.Sprintf("log %d", i))); err != nil {
						return nil, err
					}
					sent++
				}
				if token != nil {
					if err := s.SendNotificationToClient(ctx, "notifications/progress", map[string]any{"progressToken": token, "progress": i, "total": burstN}); err != nil {
						return nil, err
					}
					sent++
				}
			}
			if c, ok := ctx.Value(eventCountKey{}).(*eventCount); ok {
				c.await(ctx, sent)
			}
			return mcp.NewToolResultText("done"), nil
		})
	s.AddTool(mcp.NewTool("asks", mcp.WithDescription("Ask the client to confirm; speak while it is asked"),
		mcp.WithReadOnlyHintAnnotation(true), mcp.WithDestructiveHintAnnotation(false), mcp.WithOpenWorldHintAnnotation(false)),
		func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			c := ctx.Value(eventCountKey{}).(*eventCount)
			if err := s.SendLogMessageToClient(ctx, mcp.NewLoggingMessageNotification(mcp.LoggingLevelInfo, "asks", "before asking")); err != nil {
				return nil, err
			}
			c.await(ctx, 1) // before the request, which mcp-go could send first
			go func() {
				select {
				case <-u.speak:
				case <-ctx.Done():
					return
				}
				if s.SendLogMessageToClient(ctx, mcp.NewLoggingMessageNotification(mcp.LoggingLevelInfo, "asks", "while asking")) == nil {
					c.await(ctx, 3) // the first, the request, then this
				}
				select {
				case u.spoke <- struct{}{}:
				case <-ctx.Done():
				}
			}()
			res, err := s.RequestElicitation(ctx, mcp.ElicitationRequest{Params: mcp.ElicitationParams{Message: "Go on?",
				RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{"ok": map[string]any{"type": "boolean"}}}}})
			if err != nil {
				return nil, err
			}
			return mcp.NewToolResultText("confirmed: " + string(res.Action)), nil
		})
	h := mcpserver.NewStreamableHTTPServer(s)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			http.Error(w, "no standalone stream", http.StatusMethodNotAllowed)
			return
		}
		c := &eventCount{ResponseWriter: w, changed: make(chan struct{})}
		h.ServeHTTP(c, r.WithContext(context.WithValue(r.Context(), eventCountKey{}, c)))
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	u.url = "http://" + ln.Addr().String() + "/mcp"
	return u
}

// orderFront is capgate over u as upstream cf, which it serves as the app
// does: a caller of 2025-11-25 on a 2025-11-25 session of the upstream,
// one per subject.
func orderFront(t *testing.T, u *orderUpstream) string {
	t.Helper()
	hooks := srcmcp.Hooks{Protocol: mcpserver.RequestProtocolVersion, SessionKey: func(ctx context.Context) string {
		if c := CallerFrom(ctx); c != nil {
			return c.Sub
		}
		return ""
	}}
	_, front := serveSetup(t, setup{
		registry: sources.BuildOptions{MCP: []sources.MCPServer{{Options: srcmcp.Options{Name: "cf", URL: u.url, Hooks: hooks}}}},
		grants:   []string{"rye.execute.tool.mcp.cf.*"},
	})
	return front
}

// orderMessage is a message of a call's stream, the parts the order
// tests read.
type orderMessage struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params struct {
		Progress float64 `json:"progress"`
		Data     any     `json:"data"`
	} `json:"params"`
	Result any `json:"result"`
}

// word is m as the order tests compare it: a log message's data,
// "progress i", "result", or a request's method.
func (m orderMessage) word() string {
	switch {
	case m.Method == "notifications/message":
		return fmt.Sprint(m.Params.Data)
	case m.Method == "notifications/progress":
		return fmt.Sprintf("progress %g", m.Params.Progress)
	case m.Result != nil:
		return "result"
	}
	return m.Method
}

// burstOrder is what a call's stream carried, one word per message (the
// message itself when it is not JSON-RPC).
func burstOrder(body []byte) []string {
	if len(body) > 0 && body[0] == '{' {
		return []string{"a JSON answer: " + string(body)}
	}
	var got []string
	for _, line := range strings.Split(string(body), "\n") {
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok || data == "" {
			continue
		}
		var m orderMessage
		if json.Unmarshal([]byte(data), &m) != nil {
			got = append(got, data)
			continue
		}
		got = append(got, m.word())
	}
	return got
}

// TestCallKeepsItsOrder (issue 31, item 5): everything an upstream sends
// on a call's stream before its result (log messages and progress, sent
// in a burst and followed at once by the result) reaches the caller
// before that result, in the upstream's order, call after call, on both
// protocols, with calls side by side.
func TestCallKeepsItsOrder(t *testing.T) {
	const workers, perWorker = 4, 50
	front := orderFront(t, newOrderUpstream(t))
	toks := make([]string, workers)
	for w := range toks {
		toks[w] = mint(t, token.Claims{Sub: fmt.Sprintf("caller%d", w)})
	}
	var want []string
	for i := 1; i <= burstN; i++ {
		want = append(want, fmt.Sprintf("log %d", i), fmt.Sprintf("progress %d", i))
	}
	want = append(want, "result")

	check := func(t *testing.T, call func(w, i int) []byte) {
		var mu sync.Mutex
		failed := 0
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				for i := range perWorker {
					got := burstOrder(call(w, i))
					if strings.Join(got, ", ") != strings.Join(want, ", ") {
						mu.Lock()
						failed++
						if failed <= 3 {
							t.Errorf("worker %d, call %d: the stream carried %q, want %q", w, i, got, want)
						}
						mu.Unlock()
					}
				}
			})
		}
		wg.Wait()
		if failed > 0 {
			t.Errorf("%d of %d calls out of order", failed, workers*perWorker)
		}
	}

	t.Run("2025-11-25", func(t *testing.T) {
		sessions := make([]string, workers)
		for w := range sessions {
			sid := testkit.OpenSession(t, front, toks[w], "{}")
			if st, _, b := testkit.PostSession(t, front, toks[w], sid, `{"jsonrpc":"2.0","id":1,"method":"logging/setLevel","params":{"level":"debug"}}`); st != http.StatusOK {
				t.Fatalf("logging/setLevel: %d %s", st, b)
			}
			// The session's standalone stream is open, as a client's is.
			go io.Copy(io.Discard, testkit.SessionRequest(t, http.MethodGet, front, toks[w], sid, "").Body)
			sessions[w] = sid
		}
		check(t, func(w, i int) []byte {
			body := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"burst","arguments":{},"_meta":{"progressToken":"p%d"}}}`, 10+i, i)
			resp := testkit.SessionRequest(t, http.MethodPost, front, toks[w], sessions[w], body)
			b, _ := io.ReadAll(resp.Body)
			return b
		})
	})
	t.Run("2026-07-28", func(t *testing.T) {
		check(t, func(w, i int) []byte {
			body := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"burst","arguments":{},"_meta":{"progressToken":"p%d",`+
				`"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"t","version":"1"},`+
				`"io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/logLevel":"debug"}}}`, 10+i, i)
			_, _, b := testkit.PostMCP(t, front, toks[w], "burst", body)
			return b
		})
	})
}

// TestCallKeepsWhatComesWhileItAsks (issue 31, item 5): on a 2025-11-25
// call's stream, a log message the upstream sends before its elicitation
// request reaches the client before that request, and one it sends while
// the request waits for the client (the call's job parked, capgate having
// passed the request on) before the call's result.
func TestCallKeepsWhatComesWhileItAsks(t *testing.T) {
	u := newOrderUpstream(t)
	front := orderFront(t, u)
	tok := mint(t, token.Claims{Sub: "alice"})
	sid := testkit.OpenSession(t, front, tok, `{"elicitation":{}}`)
	if st, _, b := testkit.PostSession(t, front, tok, sid, `{"jsonrpc":"2.0","id":1,"method":"logging/setLevel","params":{"level":"debug"}}`); st != http.StatusOK {
		t.Fatalf("logging/setLevel: %d %s", st, b)
	}
	resp := testkit.SessionRequest(t, http.MethodPost, front, tok, sid, `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"asks","arguments":{}}}`)
	evs := make(chan sseEvent, 16)
	go sseEvents(resp.Body, evs)
	within := func(what string, ch chan struct{}, send bool) {
		t.Helper()
		var sent chan<- struct{}
		var got <-chan struct{}
		if send {
			sent = ch
		} else {
			got = ch
		}
		select {
		case sent <- struct{}{}:
		case <-got:
		case <-time.After(30 * time.Second):
			t.Fatalf("the upstream did not %s", what)
		}
	}
	var got []string
	for ev := range evs {
		var m orderMessage
		if json.Unmarshal([]byte(ev.data), &m) != nil {
			continue // the priming event
		}
		got = append(got, m.word())
		if m.Method == "elicitation/create" {
			// capgate has parked the call's job to ask: the upstream
			// speaks now, and the client answers once it has.
			within("take its cue", u.speak, true)
			within("send its log message", u.spoke, false)
			if st, _, b := testkit.PostSession(t, front, tok, sid, `{"jsonrpc":"2.0","id":`+string(m.ID)+`,"result":{"action":"accept","content":{"ok":true}}}`); st != http.StatusAccepted {
				t.Fatalf("the answer: %d %s", st, b)
			}
		}
	}
	if want := []string{"before asking", "elicitation/create", "while asking", "result"}; strings.Join(got, ", ") != strings.Join(want, ", ") {
		t.Errorf("the call's stream carried %q, want %q", got, want)
	}
}
