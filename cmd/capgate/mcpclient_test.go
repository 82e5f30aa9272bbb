package main

import (
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
)

// newMCPClient is client.NewClient for a client of capgate. mcp-go's
// Initialize first asks server/discover and takes a server that has not
// answered within 5 s for one that predates 2026-07-28, falling back to
// the initialize handshake: a capgate just started on a loaded machine
// (a `serve --stdio` starting its upstreams, say) could take that long,
// and the test then failed on the protocol it got. capgate answers
// server/discover, so the wait is a deadline, not a guess at its speed.
func newMCPClient(tr transport.Interface, opts ...client.ClientOption) *client.Client {
	return client.NewClient(tr, append([]client.ClientOption{client.WithDiscoverTimeout(time.Minute)}, opts...)...)
}
