package mcp

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"time"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
)

// On the stateless protocol an upstream has no standalone stream: it
// announces that its lists changed, and that a subscribed resource was
// updated, only on a subscriptions/listen stream its client keeps open
// (SEP-2575). capgate keeps one open on the shared link of an upstream
// that declares list changes or resource subscriptions, for the kinds it
// declares and the resources subscribed now (Subscribe), and handles
// what comes as it does on a session's standalone stream (notification):
// tools/list_changed refreshes the catalog, the others go to
// OnNotification (the relay lists resources and prompts again, and
// passes resources/updated to the subscribed callers). A stream that ends
// is opened again, after a backoff while it keeps ending early, as long
// as the link is the source's; on reopening after an acknowledged stream
// every list is read again (OnChange), as a change may have come between.
// A change of the subscribed resources reopens the stream at once with
// the new filter (mcp-go's client keeps one stream; the spec has no way
// to change a filter in place).

// listenFilter is what l's upstream declares it announces, with the
// resources subscribed, when it serves resource subscriptions.
func listenFilter(caps mcpgo.ServerCapabilities, subs []string) (f mcpgo.SubscriptionFilter, any bool) {
	f.ToolsListChanged = caps.Tools != nil && caps.Tools.ListChanged
	f.PromptsListChanged = caps.Prompts != nil && caps.Prompts.ListChanged
	f.ResourcesListChanged = caps.Resources != nil && caps.Resources.ListChanged
	if caps.Resources != nil && caps.Resources.Subscribe {
		f.ResourceSubscriptions = subs
	}
	return f, !f.IsEmpty()
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
	wait := s.opts.MinBackoff
	for unacked, missed := 0, false; s.live(l); {
		subs, changed := s.subscriptions()
		filter, ok := listenFilter(l.caps, subs)
		if !ok {
			// Nothing to hear until a resource is subscribed.
			select {
			case <-s.stop:
				return
			case <-changed:
				continue
			}
		}
		if missed {
			s.changed() // the catalog, and the relay's resources and prompts
		}
		start := time.Now()
		l.acked.Store(false)
		ctx, cancel := context.WithCancel(s.life)
		var refilter atomic.Bool
		go func() {
			select {
			case <-changed:
				refilter.Store(true)
				cancel()
			case <-ctx.Done():
			}
		}()
		err := l.c.Listen(ctx, filter)
		cancel()
		if !s.live(l) {
			return
		}
		if refilter.Load() {
			// Ended for the new filter, not by the upstream.
			missed = false
			continue
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

// subscriptions are the resource URIs subscribed now, sorted, and a
// channel closed when they change.
func (s *Source) subscriptions() ([]string, <-chan struct{}) {
	s.subMu.Lock()
	defer s.subMu.Unlock()
	if s.subsSet == nil {
		s.subsSet = make(chan struct{})
	}
	var uris []string
	for uri := range s.subs {
		uris = append(uris, uri)
	}
	slices.Sort(uris)
	return uris, s.subsSet
}

// setSubscribed adds or removes uri, and says whether that changed
// anything.
func (s *Source) setSubscribed(uri string, on bool) bool {
	s.subMu.Lock()
	defer s.subMu.Unlock()
	if s.subs[uri] == on {
		return false
	}
	if on {
		if s.subs == nil {
			s.subs = map[string]bool{}
		}
		s.subs[uri] = true
	} else {
		delete(s.subs, uri)
	}
	if s.subsSet != nil {
		close(s.subsSet)
	}
	s.subsSet = make(chan struct{})
	return true
}

// Subscribe asks the upstream for notifications/resources/updated of uri,
// which come to OnNotification: on the stateless protocol by naming uri
// in the listen stream's filter (the stream is reopened with it; it
// holds across reconnections), else with resources/subscribe.
func (s *Source) Subscribe(ctx context.Context, uri string) error {
	return s.subscribe(ctx, uri, true)
}

// Unsubscribe undoes Subscribe.
func (s *Source) Unsubscribe(ctx context.Context, uri string) error {
	return s.subscribe(ctx, uri, false)
}

func (s *Source) subscribe(ctx context.Context, uri string, on bool) error {
	l, err := s.client()
	if err != nil {
		return err
	}
	if l.modern() {
		s.setSubscribed(uri, on)
		return nil
	}
	method := "resources/unsubscribe"
	if on {
		method = "resources/subscribe"
	}
	_, err = s.Request(ctx, method, map[string]any{"uri": uri})
	return err
}

// live says whether l is the source's shared link now.
func (s *Source) live(l *link) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.conn == l && !s.closed
}
