package server

import (
	"context"
	"time"

	"github.com/capgate/capgate/router"
	"github.com/capgate/capgate/tool"
)

// An upstream's requestState for a prompts/get travels to the client
// inside one of capgate's own sealed states (state.go): bound to the
// caller and the prompt, expiring, and used once, so that no client reads
// or changes it, brings another's, or replays it.

// promptStateID is the job id of a prompt's state: no job holds it, so a
// tools/call that brings one finds nothing to go on with.
const promptStateID = "prompt"

// sealPromptState seals the upstream's state of prompt id for c.
func (m *MCP) sealPromptState(c *router.Caller, id, upstream string) (string, error) {
	if c == nil {
		return "", tool.Errorf(tool.CodeTokenInvalid, "no verified caller")
	}
	sealer := m.jobs.seals()
	return sealer.seal(&requestState{ID: promptStateID, Sub: c.Sub, Exp: time.Now().Add(parkTTL).UnixMilli(),
		Replica: sealer.replica, Prompt: &promptState{ID: id, State: upstream}})
}

// openPromptState opens a state the client brought back to prompt id and
// claims it once; it returns the upstream's state as the upstream sent it.
func (m *MCP) openPromptState(ctx context.Context, c *router.Caller, id, raw string) (string, error) {
	if c == nil {
		return "", tool.Errorf(tool.CodeTokenInvalid, "no verified caller")
	}
	sealer := m.jobs.seals()
	st, err := sealer.open(raw, c.Sub, time.Now())
	if err != nil {
		return "", err
	}
	if st.Prompt == nil || st.Prompt.ID != id {
		return "", errStateExpired // another call's state tells nothing of that call
	}
	if err := sealer.use(ctx, st); err != nil {
		return "", err
	}
	return st.Prompt.State, nil
}
