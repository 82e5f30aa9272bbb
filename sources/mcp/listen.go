package mcp

import (
	"errors"
	"time"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
)

// On the stateless protocol an upstream has no standalone stream: it
// announces that its lists changed only on a subscriptions/listen stream
// its client keeps open (SEP-2575). capgate keeps one open on the shared
// link of an upstream that declares list changes, for the kinds it
// declares, and handles what comes as it does on a session's standalone
// stream (notification): tools/list_changed refreshes the catalog, the
// others go to OnNotification (the relay lists resources and prompts
// again). A stream that ends is opened again, after a backoff while it
// keeps ending early, as long as the link is the source's; on reopening
// after an acknowledged stream every list is read again (OnChange), as a
// change may have come between.

// listenFilter is what l's upstream declares it announces.
func listenFilter(caps mcpgo.ServerCapabilities) (f mcpgo.SubscriptionFilter, any bool) {
	f.ToolsListChanged = caps.Tools != nil && caps.Tools.ListChanged
	f.PromptsListChanged = caps.Prompts != nil && caps.Prompts.ListChanged
	f.ResourcesListChanged = caps.Resources != nil && caps.Resources.ListChanged
	return f, f.ToolsListChanged || f.PromptsListChanged || f.ResourcesListChanged
}

// maxUnacked is how many streams in a row an upstream may fail to
// acknowledge before capgate stops opening them on the link: an upstream
// that declares list changes but does not serve the stream as the
// protocol says (the conformance suite's reference server writes it as
// newline-delimited JSON in an application/json body).
const maxUnacked = 3

// listen keeps l's subscriptions/listen stream open while l is the
// source's live link.
func (s *Source) listen(l *link) {
	filter, ok := listenFilter(l.caps)
	if !ok {
		return
	}
	wait := s.opts.MinBackoff
	for unacked, missed := 0, false; s.live(l); {
		if missed {
			s.changed() // the catalog, and the relay's resources and prompts
		}
		start := time.Now()
		l.acked.Store(false)
		err := l.c.Listen(s.life, filter)
		if !s.live(l) {
			return
		}
		if errors.Is(err, mcpgo.ErrMethodNotFound) || errors.Is(err, mcpgo.ErrInvalidParams) {
			// It refuses the stream: nothing to wait for.
			s.opts.Logger.Debug("upstream refused subscriptions/listen", "server", s.opts.Name, "err", err)
			return
		}
		// A stream that was open may have missed a change before the next.
		if missed = l.acked.Load(); missed {
			unacked = 0
		} else if unacked++; unacked >= maxUnacked {
			s.opts.Logger.Warn("upstream does not acknowledge subscriptions/listen; its list changes will not be heard until it reconnects",
				"server", s.opts.Name, "err", err)
			return
		}
		if time.Since(start) > s.opts.MaxBackoff {
			wait = s.opts.MinBackoff // it lasted: not a server that ends it at once
		}
		select {
		case <-s.stop:
			return
		case <-time.After(wait):
		}
		wait = min(wait*2, s.opts.MaxBackoff)
	}
}

// live says whether l is the source's shared link now.
func (s *Source) live(l *link) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.conn == l && !s.closed
}
