package mcp

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/mark3labs/mcp-go/client/transport"
	mcpgo "github.com/mark3labs/mcp-go/mcp"

	"github.com/capgate/capgate/tool"
)

// flight is a call in progress, for matching what the upstream sends
// outside the call's own stream back to it.
type flight struct {
	call tool.Call
}

// soleFlight returns the only call in flight, or nil when there is none
// or more than one: a request or log message that names no call can be
// given to a caller only when nobody else could be its cause.
func (s *Source) soleFlight() *flight {
	var only *flight
	n := 0
	s.flights.Range(func(_, v any) bool {
		n++
		only = v.(*flight)
		return n < 2
	})
	if n != 1 {
		return nil
	}
	return only
}

// relayed are the requests an upstream may make of the client.
var relayed = map[string]bool{
	string(mcpgo.MethodSamplingCreateMessage): true,
	string(mcpgo.MethodElicitationCreate):     true,
	string(mcpgo.MethodListRoots):             true,
}

// answer resolves one request the upstream made of the client during
// call: ping is answered here, sampling, elicitation and roots go to the
// calling client through call.Ask.
func answer(ctx context.Context, call tool.Call, method string, params json.RawMessage) (json.RawMessage, *mcpgo.JSONRPCErrorDetails) {
	switch {
	case method == string(mcpgo.MethodPing):
		return json.RawMessage("{}"), nil
	case !relayed[method]:
		return nil, &mcpgo.JSONRPCErrorDetails{Code: mcpgo.METHOD_NOT_FOUND, Message: "capgate does not relay " + method}
	case call.Ask == nil:
		return nil, &mcpgo.JSONRPCErrorDetails{Code: mcpgo.INVALID_REQUEST,
			Message: fmt.Sprintf("capgate cannot relay %s to the client of this call", method)}
	}
	res, err := call.Ask(ctx, method, params)
	if err != nil {
		return nil, &mcpgo.JSONRPCErrorDetails{Code: mcpgo.INTERNAL_ERROR, Message: tool.ErrorMessage(err)}
	}
	return res, nil
}

// serverRequest answers a request the upstream sent on mcp-go's transport
// (stdio, SSE, or outside a call's stream): it goes to the call in flight
// when there is exactly one.
func (s *Source) serverRequest(ctx context.Context, req transport.JSONRPCRequest) (*transport.JSONRPCResponse, error) {
	var call tool.Call
	if f := s.soleFlight(); f != nil {
		call = f.call
	}
	params, err := json.Marshal(req.Params)
	if err != nil {
		return nil, err
	}
	res, rpcErr := answer(ctx, call, req.Method, params)
	return &transport.JSONRPCResponse{JSONRPC: mcpgo.JSONRPC_VERSION, ID: req.ID, Result: res, Error: rpcErr}, nil
}
