package router

import "context"

type callerTokenKey struct{}

type callerToken struct {
	c   *Caller
	raw string
}

// WithCallerToken returns ctx carrying the raw bearer token c was
// verified from, bound to c: for token exchange (upstreamauth), which
// trades a caller's own token at its issuer. Every front door that
// authenticates a caller (/mcp, /rpc) sets it; it is never sent on or
// logged.
func WithCallerToken(ctx context.Context, c *Caller, raw string) context.Context {
	if c == nil || c.Anonymous || raw == "" {
		return ctx
	}
	return context.WithValue(ctx, callerTokenKey{}, callerToken{c, raw})
}

// CallerToken returns the token WithCallerToken put in ctx and the
// caller it verified as; "" and nil when there is none.
func CallerToken(ctx context.Context) (string, *Caller) {
	t, _ := ctx.Value(callerTokenKey{}).(callerToken)
	return t.raw, t.c
}
