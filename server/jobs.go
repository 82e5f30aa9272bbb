package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/capgate/capgate/internal/mcpconv"
	"github.com/capgate/capgate/router"
	"github.com/capgate/capgate/tool"
)

// A job is a tools/call whose work may need the calling client mid-way:
// an upstream's sampling or elicitation request, or a skill's model. It
// asks in MCP's multi round-trip way: the call returns input requests with
// a requestState naming the job, the client answers in a retry carrying
// that state, and the work, which kept running, goes on. mcp-go plays the
// same exchange with clients of 2025-11-25 as server-to-client requests,
// so one path serves both protocols.

// parkTTL is how long a job waits for a client to come back with answers;
// maxParkedPerSub bounds how many wait per subject.
const (
	parkTTL         = 5 * time.Minute
	maxParkedPerSub = 64
)

// askFunc asks the calling client one thing (method and params as JSON)
// and returns its answer.
type askFunc func(ctx context.Context, method string, params json.RawMessage) (json.RawMessage, error)

type jobResult struct {
	res *mcp.CallToolResult
	err error
}

type ask struct {
	method string
	params json.RawMessage
	reply  chan askReply
	// key and together: the source's own key for this ask and how many it
	// makes at once (tool.InputKey), so they go in one round as it keyed them.
	key      string
	together int
}

type askReply struct {
	res json.RawMessage
	err error
}

type job struct {
	id     string
	sub    string
	cancel context.CancelFunc
	asks   chan *ask
	done   chan jobResult

	mu  sync.Mutex
	cur context.Context // the request now waiting on the job
	// held are the work's notifications sent while no request waited on
	// the job (before the first, between rounds), for the next (relay).
	held    []func(ctx context.Context) error
	pending map[string]*ask // asked and not yet answered, by input key
	seq     int
	park    *time.Timer
	// skill is the use_skill run's state at its last sampling request, for
	// the requestState; nil for a plain call.
	skill *skillState
	// use is the Use of the requestState the job is parked under: only
	// that state, its latest, goes on with it.
	use string
	// values, when set, is the request that started the job: the work's
	// context keeps its values (the caller, the client's protocol) for
	// the sources, though not its end.
	values context.Context
	// handedOn: the run went on from the job's state on another replica,
	// which records it; this job ends without a record.
	handedOn atomic.Bool
}

type jobs struct {
	mu     sync.Mutex
	parked map[string]*job
	sealer *stateSealer // nil: one of this process's own, made on first use
}

// newJob makes a job for the caller sub; run starts it.
func newJob(sub string) *job {
	b := make([]byte, 16)
	rand.Read(b)
	return &job{id: "job_" + hex.EncodeToString(b), sub: sub,
		asks: make(chan *ask), done: make(chan jobResult, 1), pending: map[string]*ask{}}
}

// run runs work in a context of its own (the job's requests come and go)
// that ends with the work or an abandoned park.
func (j *job) run(work func(ctx context.Context, ask askFunc) (*mcp.CallToolResult, error)) *job {
	parent := context.Background()
	if j.values != nil {
		parent = context.WithoutCancel(j.values)
	}
	ctx, cancel := context.WithCancel(parent)
	j.cancel = cancel
	go func() {
		defer cancel()
		// A panic here would end the process (mcp-go recovers only its
		// own goroutine): it ends the call as an internal error instead.
		// The router has audited the call; the log gets the panic and its
		// stack, never the input.
		defer func() {
			if p := recover(); p != nil {
				slog.Default().Error("tools/call job panicked", "job", j.id, "sub", j.sub,
					"panic", fmt.Sprint(p), "stack", string(debug.Stack()))
				j.done <- jobResult{res: mcpconv.Denial(&tool.Error{Code: tool.CodeInternal,
					Message: "internal error: the call failed inside capgate"})}
			}
		}()
		res, err := work(ctx, j.ask)
		j.done <- jobResult{res, err}
	}()
	return j
}

// ask hands one question to whichever request is waiting on the job and
// waits for the client's answer.
func (j *job) ask(ctx context.Context, method string, params json.RawMessage) (json.RawMessage, error) {
	a := &ask{method: method, params: params, reply: make(chan askReply, 1)}
	a.key, a.together = tool.InputKey(ctx)
	select {
	case j.asks <- a:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	select {
	case r := <-a.reply:
		return r.res, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// maxHeld bounds the notifications a job keeps while no request waits on
// it; beyond, they are dropped.
const maxHeld = 256

// relay sends one of the work's notifications (send queues it with mcp-go
// for the request ctx serves) to the client of the request now waiting on
// the job, or, while none does, keeps it for the next one, which sends
// it before anything else (wait). So what an upstream sent before its
// result reaches the caller before that result, however soon after the
// call it came (a fast upstream's notifications can come before the
// request starts waiting on the job).
func (j *job) relay(send func(ctx context.Context) error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.cur == nil {
		if len(j.held) < maxHeld {
			j.held = append(j.held, send)
		}
		return
	}
	sendQueued(j.cur, send)
}

// sendQueued runs send for the request ctx serves and counts what it
// queued there (settle waits for it to be written).
func sendQueued(ctx context.Context, send func(ctx context.Context) error) {
	if send(ctx) == nil {
		queuedFor(ctx)
	}
}

// seals is the sealer of the jobs' request states.
func (js *jobs) seals() *stateSealer {
	js.mu.Lock()
	defer js.mu.Unlock()
	if js.sealer == nil {
		js.sealer = newStateSealer(randomSecret(), "", "", nil)
	}
	return js.sealer
}

// resume takes the parked job named by state, if it is the caller's;
// else it says why not. Another subject's state reads like an unknown
// one.
func (js *jobs) resume(state, sub string) (*job, error) {
	st, err := js.seals().open(state, sub, time.Now())
	if err != nil {
		return nil, err
	}
	j := js.take(st)
	if j == nil {
		return nil, errStateExpired
	}
	return j, nil
}

// take takes the parked job st names, if st is the state it is parked
// under, or nil.
func (js *jobs) take(st *requestState) *job {
	js.mu.Lock()
	defer js.mu.Unlock()
	j, ok := js.parked[st.ID]
	if !ok || j.sub != st.Sub || j.use != st.Use {
		return nil
	}
	delete(js.parked, st.ID)
	j.park.Stop()
	return j
}

// resume goes on with the call whose requestState req carries, given the
// answers req carries: the state is opened for c and claimed once; then
// the job it names goes on here if this replica holds it, a use_skill run
// goes on from its checkpoint, and a call parked on another replica is
// forwarded there.
func (m *MCP) resume(ctx context.Context, c *router.Caller, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	sealer := m.jobs.seals()
	st, err := sealer.open(req.Params.RequestState, c.Sub, time.Now())
	if err == nil {
		err = sealer.use(ctx, st)
	}
	if errors.Is(err, errStateInvalid) {
		// A state that fails its integrity check is a bad request
		// (SEP-2322): the client gets a JSON-RPC error, not a result.
		return nil, err
	}
	if err != nil {
		return mcpconv.Denial(err), nil
	}
	if j := m.jobs.take(st); j != nil {
		j.deliver(req.Params.InputResponses)
		return m.jobs.wait(ctx, j)
	}
	if st.Skill != nil {
		return m.continueSkill(ctx, c, st, req.Params.InputResponses)
	}
	if st.Replica != sealer.replica {
		// The upstream call waits on the replica that holds it.
		return m.forward(ctx, c, st, req)
	}
	return mcpconv.Denial(errStateExpired), nil
}

// deliver passes the client's answers to the questions they answer; a
// question left unanswered fails.
func (j *job) deliver(responses mcp.InputResponses) {
	j.mu.Lock()
	pending := j.pending
	j.pending = map[string]*ask{}
	j.mu.Unlock()
	for key, a := range pending {
		r, ok := responses[key]
		if !ok {
			a.reply <- askReply{err: fmt.Errorf("the client did not answer %s", a.method)}
			continue
		}
		if err := r.DecodeFor(mcp.MCPMethod(a.method)); err != nil {
			a.reply <- askReply{err: fmt.Errorf("the client's answer to %s: %w", a.method, err)}
			continue
		}
		var v any
		switch {
		case r.Sampling != nil:
			v = r.Sampling
		case r.Elicitation != nil:
			v = r.Elicitation
		case r.Roots != nil:
			v = r.Roots
		}
		b, err := json.Marshal(v)
		a.reply <- askReply{res: b, err: err}
	}
}

// wait serves the job on the request ctx until it finishes or asks the
// client something; then it parks the job and returns the input requests.
func (js *jobs) wait(ctx context.Context, j *job) (*mcp.CallToolResult, error) {
	j.mu.Lock()
	j.cur = ctx
	// What the work sent while nobody waited goes first, in its order:
	// the lock keeps a later notification from overtaking it.
	for _, send := range j.held {
		sendQueued(ctx, send)
	}
	j.held = nil
	j.mu.Unlock()
	detach := func() {
		j.mu.Lock()
		j.cur = nil
		j.mu.Unlock()
	}
	for {
		select {
		case r := <-j.done:
			detach()
			settle(ctx) // what the call sent goes before its answer
			if _, task := r.err.(*taskCreated); task && !isForwarded(ctx) && !passTask(ctx, r.err) {
				// No answer here can carry a task (a 2025-11-25 stream).
				return mcpconv.Denial(tool.Errorf(tool.CodeInternal, "the call became a task, which this answer cannot carry")), nil
			}
			if r.err != nil {
				return upstreamFailure(ctx, r.err)
			}
			return r.res, nil
		case a := <-j.asks:
			b := mcpserver.NewInputRequestBuilder("")
			n, got, want := 0, 0, a.together
			for more := true; more; {
				if err := j.add(b, a); err != nil {
					a.reply <- askReply{err: err}
				} else {
					n++
				}
				got++
				if got < want {
					// The rest of a source's round is on its way: wait for it.
					select {
					case a = <-j.asks:
						continue
					case <-ctx.Done():
					}
				}
				select {
				case a = <-j.asks:
				default:
					more = false
				}
			}
			if n == 0 {
				continue
			}
			detach()
			state, err := js.park(j)
			if err != nil {
				j.cancel()
				return mcpconv.Denial(err), nil
			}
			b.RequestState(state)
			settle(ctx)
			if !mcp.IsModernProtocol(mcpserver.RequestProtocolVersion(ctx)) && !isForwarded(ctx) {
				// mcp-go asks a 2025-11-25 client within this request; if the
				// request ends first, nobody will come back for the job.
				context.AfterFunc(ctx, func() { js.abandon(j) })
			}
			return b.ToolResult(), nil
		case <-ctx.Done():
			// The client gave up on the call.
			detach()
			j.cancel()
			return nil, ctx.Err()
		}
	}
}

// abandon ends j if it is still parked. A skill run whose state was
// used (on another replica, which rebuilt the run from it) is handed on,
// not abandoned: claiming the state now, dead either way, tells which.
func (js *jobs) abandon(j *job) {
	js.mu.Lock()
	_, still := js.parked[j.id]
	delete(js.parked, j.id)
	use := j.use
	js.mu.Unlock()
	if !still {
		return
	}
	j.park.Stop()
	if j.skill != nil && use != "" {
		fresh, err := js.seals().claim(context.Background(), claimKey(use), time.Now().Add(claimGrace))
		j.handedOn.Store(err == nil && !fresh)
	}
	j.cancel()
}

// park keeps j for its client's answers, for parkTTL at most, and returns
// its sealed requestState. It refuses when the caller already has
// maxParkedPerSub jobs waiting, so that calls nobody comes back for cannot
// pile up.
func (js *jobs) park(j *job) (string, error) {
	sealer := js.seals()
	st := &requestState{ID: j.id, Sub: j.sub, Exp: time.Now().Add(parkTTL).UnixMilli(), Replica: sealer.replica, URL: sealer.url}
	j.mu.Lock()
	if j.skill != nil {
		sk := *j.skill
		for key := range j.pending {
			sk.Key = key // a skill asks one thing at a time: its model
		}
		st.Skill = &sk
	}
	j.mu.Unlock()
	state, err := sealer.seal(st)
	if err != nil {
		return "", err
	}
	js.mu.Lock()
	defer js.mu.Unlock()
	if js.parked == nil {
		js.parked = map[string]*job{}
	}
	n := 0
	for _, p := range js.parked {
		if p.sub == j.sub {
			n++
		}
	}
	if n >= maxParkedPerSub {
		return "", tool.Errorf(tool.CodeRateLimited, "%d calls of yours already wait for your answers; answer or abandon them (they expire after %s)", n, parkTTL)
	}
	js.parked[j.id] = j
	j.use = st.Use
	j.park = time.AfterFunc(parkTTL, func() { js.abandon(j) })
	return state, nil
}

// add renders one question as an input request.
func (j *job) add(b *mcpserver.InputRequestBuilder, a *ask) error {
	j.mu.Lock()
	key := a.key // the source's own, as it keyed it
	if _, taken := j.pending[key]; key == "" || taken {
		for {
			j.seq++
			key = "q" + strconv.Itoa(j.seq)
			if _, taken := j.pending[key]; !taken {
				break
			}
		}
	}
	j.mu.Unlock()
	switch mcp.MCPMethod(a.method) {
	case mcp.MethodSamplingCreateMessage:
		var p mcp.CreateMessageParams
		if err := json.Unmarshal(a.params, &p); err != nil {
			return fmt.Errorf("sampling/createMessage params: %w", err)
		}
		b.Sample(key, p)
	case mcp.MethodElicitationCreate:
		var p mcp.ElicitationParams
		if err := json.Unmarshal(a.params, &p); err != nil {
			return fmt.Errorf("elicitation/create params: %w", err)
		}
		b.Elicit(key, p)
	case mcp.MethodListRoots:
		b.Roots(key)
	default:
		return errors.New("capgate cannot ask a client " + a.method)
	}
	j.mu.Lock()
	j.pending[key] = a
	j.mu.Unlock()
	return nil
}
