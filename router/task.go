package router

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/capgate/capgate/audit"
	"github.com/capgate/capgate/harden"
	"github.com/capgate/capgate/router/state"
	"github.com/capgate/capgate/tool"
)

// Tasks (the MCP tasks extension, SEP-2663). An upstream that offers the
// extension may answer a call whose caller declared it with a task
// instead of a result. The call passed every gate; capgate records the
// task under an id of its own, bound to the caller's subject, in the
// store the replicas share, and gives the caller that id. Each task
// method the caller sends later (tasks/get, tasks/update, tasks/cancel)
// comes here: only the subject that made the task reaches it, and only
// while it may still call the tool; anyone else is told it does not
// exist. The upstream's own id never leaves capgate.

// MaxTaskTTL bounds how long capgate keeps a task's owner, whatever the
// upstream's ttlMs (null is unlimited there).
const MaxTaskTTL = 7 * 24 * time.Hour

// minTaskTTL is the least it keeps one, so that a task with a short ttlMs
// can still be read once it ends.
const minTaskTTL = time.Minute

// ErrTaskNotFound is the answer for a task id that is unknown, expired,
// another caller's, or of a tool the caller may no longer call: the four
// are not told apart.
var ErrTaskNotFound = &tool.Error{Code: tool.CodeNotFound, Message: "Failed to retrieve task: Task not found"}

// keepTask records the task res carries as the caller's and puts
// capgate's id for it in its place.
func (r *Router) keepTask(ctx context.Context, st *callState, res *tool.Result) error {
	d := st.d
	if !st.req.Tasks {
		return tool.Errorf(tool.CodeInvalidOutput, "%s answered with a task, which this call did not declare it takes", d.ID)
	}
	if f, ok := harden.JSON(res.Task); ok {
		return harden.Withheld(d.ID, f)
	}
	var task map[string]json.RawMessage
	var upstreamID string
	if err := json.Unmarshal(res.Task, &task); err != nil || json.Unmarshal(task["taskId"], &upstreamID) != nil || upstreamID == "" {
		return tool.Errorf(tool.CodeInvalidOutput, "%s answered with a task without a taskId", d.ID)
	}
	ttl := MaxTaskTTL
	var ttlMS *float64
	if raw, ok := task["ttlMs"]; ok && json.Unmarshal(raw, &ttlMS) == nil && ttlMS != nil {
		ttl = min(max(time.Duration(*ttlMS)*time.Millisecond, minTaskTTL), MaxTaskTTL)
	}
	// The task exists upstream whatever happens to this call now: record
	// it even if the caller has gone.
	rec, err := r.opts.State.CreateTask(context.WithoutCancel(ctx), st.c.Sub, d.ID, upstreamID, st.req.RequestID, ttl)
	if err != nil {
		return tool.Wrap(err, tool.CodeBackendUnavailable, "%s made a task that capgate could not record", d.ID)
	}
	task["taskId"], _ = json.Marshal(rec.ID)
	res.Task, err = json.Marshal(task)
	return err
}

// TaskRequest is one task method a caller sends.
type TaskRequest struct {
	Method string // tasks/get, tasks/update or tasks/cancel
	ID     string // capgate's task id
	// Params are the request's other members (inputResponses, ...), a
	// JSON object or nil; taskId and _meta are capgate's to set.
	Params   json.RawMessage
	Protocol string // for the audit
}

// Task relays a task method for the caller's task and returns the
// upstream's result, hardened and naming capgate's id. It writes one
// audit record (type task) whatever the outcome.
func (r *Router) Task(ctx context.Context, c *Caller, req TaskRequest) (json.RawMessage, error) {
	tk, err := r.admit()
	if err != nil {
		return nil, err
	}
	defer tk.Done()
	start := time.Now()
	ev := audit.Event{Type: audit.TypeTask, Protocol: req.Protocol, Detail: req.Method, Time: r.opts.Now()}
	if c != nil {
		ev.Sub, ev.ChatID, ev.ChatType = c.Sub, c.ChatID(), c.ChatType()
	}
	out, err := r.task(ctx, c, req, &ev)
	ev.Duration = time.Since(start)
	if err != nil {
		ev.Decision, ev.Code = "deny", string(tool.ErrorCode(err))
		if ev.Code == string(tool.CodeBackendUnavailable) || ev.Code == string(tool.CodeInternal) {
			ev.Decision = "error"
		}
	} else {
		ev.Decision = "allow"
	}
	r.record(&tk, ev)
	return out, err
}

func (r *Router) task(ctx context.Context, c *Caller, req TaskRequest, ev *audit.Event) (json.RawMessage, error) {
	if c == nil || req.ID == "" {
		return nil, ErrTaskNotFound
	}
	rec, err := r.opts.State.Task(ctx, req.ID)
	if errors.Is(err, state.ErrNotFound) {
		return nil, ErrTaskNotFound
	} else if err != nil {
		return nil, tool.Wrap(err, tool.CodeBackendUnavailable, "the task store did not answer")
	}
	if rec.Sub != c.Sub {
		return nil, ErrTaskNotFound // another's: it does not exist for this caller
	}
	ev.Tool, ev.RequestID = rec.ToolID, rec.RequestID
	ev.ToolName = rec.ToolID
	d, ok := r.opts.Registry.Snapshot().Lookup(rec.ToolID)
	if !ok || !r.Reachable(c, d) {
		ev.Gate = GateCapability
		return nil, ErrTaskNotFound
	}
	ev.Kind = string(d.Kind)
	src, ok := r.opts.Registry.Source(d)
	tasker, _ := src.(tool.Tasker)
	if !ok || tasker == nil || !tasker.OffersTasks() {
		return nil, tool.Errorf(tool.CodeBackendUnavailable, "%s's source offers no tasks now", d.ID)
	}
	if !c.Anonymous {
		ctx = tool.WithSubject(ctx, c.Sub)
	}
	ctx, cancel := context.WithTimeout(ctx, r.opts.CallTimeout)
	defer cancel()
	raw, err := tasker.TaskRequest(ctx, req.Method, rec.UpstreamID, req.Params)
	if err != nil {
		if !isToolError(err) {
			err = tool.Wrap(err, tool.CodeBackendUnavailable, "%s: %s failed", d.ID, req.Method)
		}
		return nil, err
	}
	if f, ok := harden.JSON(raw); ok {
		return nil, harden.Withheld(fmt.Sprintf("%s %s", d.ID, req.Method), f)
	}
	return renameTask(raw, rec.ID)
}

// renameTask puts id in place of the upstream's taskId in a result, when
// it has one (tasks/get; tasks/update and tasks/cancel answer an ack).
func renameTask(raw json.RawMessage, id string) (json.RawMessage, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return nil, tool.Errorf(tool.CodeInvalidOutput, "the upstream's task answer is not a JSON object")
	}
	if _, ok := fields["taskId"]; !ok {
		return raw, nil
	}
	fields["taskId"], _ = json.Marshal(id)
	return json.Marshal(fields)
}

// TaskWatch is a task whose status notifications a caller asked for and
// may receive.
type TaskWatch struct {
	ID, UpstreamID string // capgate's id, the upstream's
	ToolID         string
	Source         tool.TaskListener
}

// WatchTasks picks, of the task ids a caller's subscriptions/listen names,
// those whose status notifications it may receive: its own (made by its
// subject), unexpired, of a tool it may still call, on a source that can
// tell of them. The rest are left out without a reason, so that another's
// task, an expired one and an unknown id look alike. It writes one audit
// record (type task, detail subscriptions/listen).
func (r *Router) WatchTasks(ctx context.Context, c *Caller, ids []string, protocol string) ([]TaskWatch, error) {
	tk, err := r.admit()
	if err != nil {
		return nil, err
	}
	defer tk.Done()
	start := time.Now()
	ev := audit.Event{Type: audit.TypeTask, Protocol: protocol, Time: r.opts.Now()}
	if c != nil {
		ev.Sub, ev.ChatID, ev.ChatType = c.Sub, c.ChatID(), c.ChatType()
	}
	var out []TaskWatch
	seen := map[string]bool{}
	for _, id := range ids {
		if c == nil || id == "" || seen[id] {
			continue
		}
		seen[id] = true
		rec, err := r.opts.State.Task(ctx, id)
		if errors.Is(err, state.ErrNotFound) {
			continue
		} else if err != nil {
			err = tool.Wrap(err, tool.CodeBackendUnavailable, "the task store did not answer")
			ev.Decision, ev.Code, ev.Duration = "error", string(tool.ErrorCode(err)), time.Since(start)
			ev.Detail = "subscriptions/listen"
			r.record(&tk, ev)
			return nil, err
		}
		if rec.Sub != c.Sub {
			continue // another's: it does not exist for this caller
		}
		d, ok := r.opts.Registry.Snapshot().Lookup(rec.ToolID)
		if !ok || !r.Reachable(c, d) {
			continue
		}
		src, _ := r.opts.Registry.Source(d)
		l, ok := src.(tool.TaskListener)
		if !ok || !l.OffersTasks() {
			continue
		}
		out = append(out, TaskWatch{ID: rec.ID, UpstreamID: rec.UpstreamID, ToolID: rec.ToolID, Source: l})
		ev.Tool, ev.ToolName, ev.Kind = rec.ToolID, rec.ToolID, string(d.Kind)
	}
	ev.Detail = fmt.Sprintf("subscriptions/listen: %d of %d task ids", len(out), len(ids))
	ev.Decision, ev.Duration = "allow", time.Since(start)
	if len(out) == 0 {
		ev.Decision, ev.Code = "deny", string(tool.CodeNotFound)
	}
	r.record(&tk, ev)
	return out, nil
}

// TaskNotice is an upstream's notifications/tasks params for w's task as
// its caller c may receive them: hardened, under capgate's id, without the
// upstream's _meta. It says no to a notification of any other task (an
// upstream that sends more than was asked for), to one whose tool c may
// no longer call, and to one hardening withholds (the caller's tasks/get
// then says why).
func (r *Router) TaskNotice(c *Caller, w TaskWatch, params json.RawMessage) (json.RawMessage, bool) {
	var fields map[string]json.RawMessage
	var upstreamID string
	if json.Unmarshal(params, &fields) != nil || json.Unmarshal(fields["taskId"], &upstreamID) != nil || upstreamID != w.UpstreamID {
		return nil, false
	}
	if d, ok := r.opts.Registry.Snapshot().Lookup(w.ToolID); !ok || !r.Reachable(c, d) {
		return nil, false
	}
	if _, found := harden.JSON(params); found {
		return nil, false
	}
	delete(fields, "_meta")
	fields["taskId"], _ = json.Marshal(w.ID)
	b, err := json.Marshal(fields)
	return b, err == nil
}
