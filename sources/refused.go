package sources

import (
	"context"
	"fmt"
	"strings"

	"github.com/capgate/capgate/registry"
	"github.com/capgate/capgate/risk"
	"github.com/capgate/capgate/tool"
)

// refused stands for a stdio MCP server or bridge provider that capgate
// did not start because its launch loosened since capgate.lock pinned it
// (registry.Lock.Refuses): it lists the pinned tools, which the registry
// quarantines naming each change, and runs nothing.
type refused struct {
	kind    tool.Kind
	id      string
	tools   []*tool.Descriptor
	changes []string
}

// refuse is source kind:id in place of the process launch would start,
// or nil when lock lets it start.
func refuse(lock *registry.Lock, kind tool.Kind, id string, launch []byte, g *tool.Guarantees, log func(string, ...any)) tool.Source {
	tools, changes := lock.Refuses(kind, id, launch)
	if tools == nil {
		return nil
	}
	for _, d := range tools {
		d.Risk = risk.Assess(risk.Declaration{}, risk.Declaration{}, risk.Hints{Name: d.Name, Description: d.Description})
		d.Guarantees = g.Clone()
	}
	log("not started: its run, program or declared guarantees changed since capgate.lock pinned it; its tools are quarantined until an operator reviews it and runs `capgate tools lock`",
		"source", string(kind)+":"+id, "changes", strings.Join(changes, ", "))
	return &refused{kind: kind, id: id, tools: tools, changes: changes}
}

func (r *refused) ID() string      { return r.id }
func (r *refused) Kind() tool.Kind { return r.kind }

func (r *refused) List(context.Context) ([]*tool.Descriptor, error) {
	out := make([]*tool.Descriptor, len(r.tools))
	for i, d := range r.tools {
		out[i] = d.Clone()
	}
	return out, nil
}

// Call is never reached through the registry (the tools are quarantined);
// it refuses all the same.
func (r *refused) Call(context.Context, tool.Call) (*tool.Result, error) {
	return nil, &tool.Error{Code: tool.CodeAccessDenied, Gate: "definition_pin",
		Message: fmt.Sprintf("%s:%s was not started: its launch changed since capgate.lock pinned it (%s)", r.kind, r.id, strings.Join(r.changes, ", "))}
}
