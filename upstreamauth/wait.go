package upstreamauth

import (
	"context"
	"time"

	"github.com/capgate/capgate/store"
	"github.com/capgate/capgate/tool"
)

// waitPoll is how often WaitLinked reads the store: the callback may
// land on another replica, whose wake-up this process does not see.
const waitPoll = 500 * time.Millisecond

// WaitLinked waits until sub holds a credential for server (the user
// finished the sign-in a link began, on this replica or another), ctx
// ends, or the link expires (store.FlowTTL).
func (b *Broker) WaitLinked(ctx context.Context, sub, server string) error {
	if _, ok := b.server(server); !ok {
		return tool.Errorf(tool.CodeNotFound, "no mcp server %q signs in its users", server)
	}
	key := sub + "\x00" + server
	ch := make(chan struct{}, 1)
	b.mu.Lock()
	if b.waiting == nil {
		b.waiting = map[string]map[chan struct{}]struct{}{}
	}
	if b.waiting[key] == nil {
		b.waiting[key] = map[chan struct{}]struct{}{}
	}
	b.waiting[key][ch] = struct{}{}
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		delete(b.waiting[key], ch)
		if len(b.waiting[key]) == 0 {
			delete(b.waiting, key)
		}
		b.mu.Unlock()
	}()
	ctx, cancel := context.WithTimeout(ctx, store.FlowTTL)
	defer cancel()
	tick := time.NewTicker(waitPoll)
	defer tick.Stop()
	for {
		if a, err := b.Status(ctx, sub, server); err == nil && a.Linked {
			return nil
		}
		select {
		case <-ch:
		case <-tick.C:
		case <-ctx.Done():
			return tool.Wrap(ctx.Err(), tool.CodeAuthRequired, "mcp server %s: the sign-in was not finished in time", server)
		}
	}
}

// wake tells the calls waiting for sub on server that they may go on.
func (b *Broker) wake(sub, server string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for ch := range b.waiting[sub+"\x00"+server] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}
