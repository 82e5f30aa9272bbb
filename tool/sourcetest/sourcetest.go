// Package sourcetest is the contract every tool.Source (ext, bridge, mcp)
// honours, run against a real, started source by Run. The contract:
//
//   - List: every descriptor's ID is tool.ID(src.Kind(), src.ID(), Name),
//     its Kind and Source are the source's, names are unique, Available is
//     set, the input schema is a JSON object (its "type", when given, is
//     "object"), an output schema if any is an object, and the risk level
//     and side effects are settled with where each came from. The
//     descriptors are the caller's: changing one changes no later List.
//   - Call of a listed tool with valid input returns a Result whose
//     content blocks are JSON objects with a string "type", and whose
//     structured content, if any, is a JSON object.
//   - A tool that fails comes back either as a Result with IsError or as a
//     *tool.Error with a code and a message, never a bare error (which
//     reads as internal_error). The code is a stable tool code, except a
//     bridge provider's own error code, which is passed on as Ash does.
//   - A tool the source does not have (an unknown name, or another
//     source's descriptor) is capability_not_found.
//   - A call whose context is cancelled mid-call returns a *tool.Error
//     within cancelBound of the cancel, and the source answers again
//     within usableBound.
//   - Concurrent calls each get their own answer.
//   - An answer over the source's output limit is capability_invalid_output
//     whose message names the limit and whose hint names its setting, and
//     the source answers again afterwards.
//   - A process the source starts does not see the host's other variables:
//     a secret set in the host environment never appears in an answer.
//   - A tool.Closer's Close can be called twice, ends the process the
//     source started (when the harness can tell), and a call after it
//     fails promptly with capability_backend_unavailable.
package sourcetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capgate/capgate/risk"
	"github.com/capgate/capgate/tool"
)

// SecretVar is the host variable Run sets, to a fresh random value,
// before each open; no answer of the source may contain its value.
const SecretVar = "CAPGATE_SOURCETEST_SECRET"

const (
	cancelBound = 5 * time.Second  // a cancelled call returns within this
	usableBound = 15 * time.Second // a source answers again within this
)

// Case is one call: the source's own name for a tool, and its input.
type Case struct {
	Tool  string
	Input json.RawMessage
}

// Harness is a started source and the fixture tools the contract uses.
type Harness struct {
	Source tool.Source
	// Echo names a tool whose answer contains the string that EchoInput
	// put in its input.
	Echo      string
	EchoInput func(s string) json.RawMessage
	// Fail is a call that fails as a tool failure.
	Fail Case
	// Slow is a call that runs for many seconds unless cancelled.
	Slow Case
	// Big is a call whose answer is over the source's output limit.
	Big Case
	// Environ is a call that answers with the environment of the process
	// that ran it ("K=V" strings); zero when the source does not start the
	// process (an HTTP upstream), which Run then skips.
	Environ Case
	// Running, when set, reports whether the process the source started
	// still runs; Close must end it.
	Running func() bool
}

// Run runs the contract. open is called once per subtest, after Run has
// set SecretVar in the environment, and must return a started source
// (closing it at the test's cleanup). Run sets environment variables, so
// its test must not be parallel.
func Run(t *testing.T, open func(t *testing.T) Harness) {
	start := func(t *testing.T) (Harness, string) {
		t.Helper()
		secret := "sourcetest-secret-" + rand.Text()
		t.Setenv(SecretVar, secret)
		return open(t), secret
	}
	t.Run("List", func(t *testing.T) { h, _ := start(t); checkList(t, h.Source) })
	t.Run("Call", func(t *testing.T) {
		h, _ := start(t)
		checkResult(t, "echo", mustCall(t, h, context.Background(), h.Echo, h.EchoInput("hello-contract")), "hello-contract")
	})
	t.Run("ToolError", func(t *testing.T) { h, _ := start(t); checkToolError(t, h) })
	t.Run("UnknownTool", func(t *testing.T) { h, _ := start(t); checkUnknown(t, h) })
	t.Run("Cancel", func(t *testing.T) { h, _ := start(t); checkCancel(t, h) })
	t.Run("Concurrent", func(t *testing.T) { h, _ := start(t); checkConcurrent(t, h) })
	t.Run("OutputLimit", func(t *testing.T) { h, _ := start(t); checkLimit(t, h) })
	t.Run("Secrets", func(t *testing.T) {
		h, secret := start(t)
		if h.Environ.Tool == "" {
			t.Skip("the source does not start the upstream process")
		}
		checkSecrets(t, h, secret)
	})
	t.Run("Close", func(t *testing.T) { h, _ := start(t); checkClose(t, h) })
}

func checkList(t *testing.T, src tool.Source) {
	ds, err := src.List(context.Background())
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	if len(ds) == 0 {
		t.Fatal("List returned no tools")
	}
	seen := map[string]bool{}
	for _, d := range ds {
		where := fmt.Sprintf("tool %q", d.ID)
		if want := tool.ID(src.Kind(), src.ID(), d.Name); d.ID != want || d.Name == "" {
			t.Errorf("%s: id is not <kind>:<source>:<name> = %q", where, want)
		}
		if k, s, n, err := tool.ParseID(d.ID); err != nil || k != src.Kind() || s != src.ID() || n != d.Name {
			t.Errorf("%s: ParseID = %s %s %s %v", where, k, s, n, err)
		}
		if d.Kind != src.Kind() || d.Source != src.ID() {
			t.Errorf("%s: kind %q source %q, want the source's %q %q", where, d.Kind, d.Source, src.Kind(), src.ID())
		}
		if seen[d.ID] {
			t.Errorf("%s: listed twice", where)
		}
		seen[d.ID] = true
		if !d.Available {
			t.Errorf("%s: not available", where)
		}
		if err := checkSchema(d.InputSchema, true); err != nil {
			t.Errorf("%s: input schema: %v", where, err)
		}
		if err := checkSchema(d.OutputSchema, false); err != nil {
			t.Errorf("%s: output schema: %v", where, err)
		}
		if d.Risk.Level == risk.Unset || d.Risk.LevelFrom == "" || d.Risk.EffectsFrom == "" {
			t.Errorf("%s: risk not settled: %+v", where, d.Risk)
		}
	}
	// The descriptors are the caller's.
	ds[0].Description = "changed by the caller"
	ds[0].InputSchema = json.RawMessage(`{"type":"object","changed":true}`)
	again, err := src.List(context.Background())
	if err != nil {
		t.Fatalf("List again: %v", err)
	}
	for _, d := range again {
		if d.ID == ds[0].ID && (d.Description == "changed by the caller" || strings.Contains(string(d.InputSchema), "changed")) {
			t.Errorf("tool %q: changing a listed descriptor changed the source's", d.ID)
		}
	}
}

// checkSchema wants a JSON object; an input schema is required and its
// "type", if any, is "object".
func checkSchema(s json.RawMessage, input bool) error {
	if len(s) == 0 {
		if input {
			return errors.New("missing")
		}
		return nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(s, &m); err != nil || m == nil {
		return fmt.Errorf("not a JSON object: %.80s", s)
	}
	if typ, ok := m["type"]; ok && input && string(typ) != `"object"` {
		return fmt.Errorf(`"type" is %s, want "object"`, typ)
	}
	return nil
}

// describe returns the source's descriptor for name, as List gives it.
func describe(t *testing.T, src tool.Source, name string) *tool.Descriptor {
	t.Helper()
	ds, err := src.List(context.Background())
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	for _, d := range ds {
		if d.Name == name {
			return d
		}
	}
	t.Fatalf("the source lists no tool %q (the harness names it)", name)
	return nil
}

func call(t *testing.T, h Harness, ctx context.Context, name string, input json.RawMessage) (*tool.Result, error) {
	t.Helper()
	return h.Source.Call(ctx, tool.Call{Tool: describe(t, h.Source, name), Input: input})
}

func mustCall(t *testing.T, h Harness, ctx context.Context, name string, input json.RawMessage) *tool.Result {
	t.Helper()
	r, err := call(t, h, ctx, name, input)
	if err != nil {
		t.Fatalf("call %s %s: %v", name, input, err)
	}
	return r
}

// answer is a result's content and structured content as one text.
func answer(r *tool.Result) string {
	var b strings.Builder
	for _, c := range r.Content {
		b.Write(c)
	}
	b.Write(r.Structured)
	return b.String()
}

// checkResult checks a result's shape and that it carries want.
func checkResult(t *testing.T, what string, r *tool.Result, want string) {
	t.Helper()
	if r == nil {
		t.Fatalf("%s: nil result and nil error", what)
	}
	if r.IsError {
		t.Errorf("%s: IsError for a valid call: %s", what, answer(r))
	}
	if len(r.Content) == 0 {
		t.Errorf("%s: no content blocks", what)
	}
	for i, c := range r.Content {
		var block struct {
			Type *string `json:"type"`
		}
		if err := json.Unmarshal(c, &block); err != nil || block.Type == nil || *block.Type == "" {
			t.Errorf("%s: content[%d] is not a JSON object with a type: %.120s", what, i, c)
		}
	}
	if len(r.Structured) > 0 {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(r.Structured, &m); err != nil || m == nil {
			t.Errorf("%s: structured content is not a JSON object: %.120s", what, r.Structured)
		}
	}
	if !strings.Contains(answer(r), want) {
		t.Errorf("%s: the answer does not carry %q: %.300s", what, want, answer(r))
	}
}

// checkCoded wants err to be a *tool.Error with a code and a message.
func checkCoded(t *testing.T, what string, err error) *tool.Error {
	t.Helper()
	var e *tool.Error
	if !errors.As(err, &e) {
		t.Fatalf("%s: error %v (%T) is not a *tool.Error, so it reads as internal_error", what, err, err)
	}
	if e.Code == "" || e.Code == tool.CodeInternal || strings.TrimSpace(e.Message) == "" {
		t.Errorf("%s: error without a code or message: %q %q", what, e.Code, e.Message)
	}
	return e
}

func checkToolError(t *testing.T, h Harness) {
	r, err := call(t, h, context.Background(), h.Fail.Tool, h.Fail.Input)
	switch {
	case err != nil:
		checkCoded(t, "failing tool", err)
	case r == nil:
		t.Fatal("failing tool: nil result and nil error")
	case !r.IsError:
		t.Errorf("failing tool: a result without IsError: %s", answer(r))
	}
}

func checkUnknown(t *testing.T, h Harness) {
	echo := describe(t, h.Source, h.Echo)
	unknown := echo.Clone()
	unknown.Name = "no_such_tool_sourcetest"
	unknown.ID = tool.ID(unknown.Kind, unknown.Source, unknown.Name)
	foreign := echo.Clone()
	foreign.Source = "other-source"
	foreign.ID = tool.ID(foreign.Kind, foreign.Source, foreign.Name)
	for what, d := range map[string]*tool.Descriptor{"unknown name": unknown, "another source's tool": foreign, "no descriptor": nil} {
		_, err := h.Source.Call(context.Background(), tool.Call{Tool: d, Input: h.EchoInput("x")})
		if tool.ErrorCode(err) != tool.CodeNotFound {
			t.Errorf("%s: error %v, want %s", what, err, tool.CodeNotFound)
		}
	}
}

// usable waits until echo answers again.
func usable(t *testing.T, h Harness, after string) {
	t.Helper()
	deadline := time.Now().Add(usableBound)
	for {
		r, err := call(t, h, context.Background(), h.Echo, h.EchoInput("still-here"))
		if err == nil {
			checkResult(t, "echo after "+after, r, "still-here")
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the source did not answer within %s after %s: %v", usableBound, after, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func checkCancel(t *testing.T, h Harness) {
	d := describe(t, h.Source, h.Slow.Tool)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type out struct {
		r   *tool.Result
		err error
	}
	done := make(chan out, 1)
	go func() {
		r, err := h.Source.Call(ctx, tool.Call{Tool: d, Input: h.Slow.Input})
		done <- out{r, err}
	}()
	time.Sleep(300 * time.Millisecond)
	cancel()
	select {
	case o := <-done:
		if o.err == nil {
			t.Fatalf("the cancelled call succeeded: %s", answer(o.r))
		}
		checkCoded(t, "cancelled call", o.err)
	case <-time.After(cancelBound):
		t.Fatalf("the cancelled call had not returned %s after the cancel", cancelBound)
	}
	usable(t, h, "a cancelled call")
}

func checkConcurrent(t *testing.T, h Harness) {
	d := describe(t, h.Source, h.Echo)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 3 {
				want := fmt.Sprintf("call-%d-%d-%s", i, j, hex.EncodeToString([]byte{byte(i), byte(j)}))
				r, err := h.Source.Call(context.Background(), tool.Call{Tool: d, Input: h.EchoInput(want)})
				if err != nil {
					t.Errorf("concurrent call %s: %v", want, err)
					continue
				}
				checkResult(t, "concurrent call", r, want)
			}
		})
	}
	wg.Wait()
}

func checkLimit(t *testing.T, h Harness) {
	r, err := call(t, h, context.Background(), h.Big.Tool, h.Big.Input)
	if tool.ErrorCode(err) != tool.CodeInvalidOutput {
		got := ""
		if r != nil {
			got = fmt.Sprintf(" (an answer of %d bytes)", len(answer(r)))
		}
		t.Fatalf("over the limit: error %v%s, want %s", err, got, tool.CodeInvalidOutput)
	}
	// The caller learns it was the limit, and the operator where to set it.
	if e := checkCoded(t, "over the limit", err); !strings.Contains(e.Message, "limit") || e.Hint == "" {
		t.Errorf("over the limit: message %q and hint %q do not name the limit and its setting", e.Message, e.Hint)
	}
	usable(t, h, "an answer over the limit")
}

func checkSecrets(t *testing.T, h Harness, secret string) {
	r, err := call(t, h, context.Background(), h.Environ.Tool, h.Environ.Input)
	if err != nil {
		t.Fatalf("environ: %v", err)
	}
	got := answer(r)
	// The answer must really be an environment, or the check below is empty.
	if !strings.Contains(got, "PATH=") {
		t.Fatalf("the environ tool's answer holds no PATH=, so it shows no environment: %.300s", got)
	}
	if strings.Contains(got, secret) || strings.Contains(got, SecretVar) {
		t.Errorf("the process the source started saw the host's %s", SecretVar)
	}
}

func checkClose(t *testing.T, h Harness) {
	c, ok := h.Source.(tool.Closer)
	if !ok {
		t.Skip("the source holds nothing to close")
	}
	d := describe(t, h.Source, h.Echo)
	ranBefore := h.Running != nil && h.Running()
	if err := c.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if h.Running != nil {
		if !ranBefore {
			t.Error("the source's process did not run before Close, so Close's end of it is not checked")
		}
		deadline := time.Now().Add(cancelBound)
		for h.Running() {
			if time.Now().After(deadline) {
				t.Fatalf("the source's process still runs %s after Close", cancelBound)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	done := make(chan error, 1)
	go func() {
		_, err := h.Source.Call(context.Background(), tool.Call{Tool: d, Input: h.EchoInput("closed")})
		done <- err
	}()
	select {
	case err := <-done:
		if tool.ErrorCode(err) != tool.CodeBackendUnavailable {
			t.Errorf("a call after Close: error %v, want %s", err, tool.CodeBackendUnavailable)
		}
	case <-time.After(cancelBound):
		t.Fatalf("a call after Close had not returned after %s", cancelBound)
	}
}
