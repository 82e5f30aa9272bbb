package mcp

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/mark3labs/mcp-go/client/transport"
	mcpgo "github.com/mark3labs/mcp-go/mcp"

	"github.com/capgate/capgate/tool"
)

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
// (stdio, SSE, or the standalone stream of streamable HTTP) on link l. On
// a caller's own session (Hooks.SessionKey) it belongs to that caller's
// latest call in flight, and is relayed there. Elsewhere nothing says which
// call caused it, and guessing (say, the only call in flight) could hand
// one subject's sampling or elicitation to another's client: ping is
// answered, everything else refused.
func (s *Source) serverRequest(ctx context.Context, l *link, req transport.JSONRPCRequest) (*transport.JSONRPCResponse, error) {
	if req.Method == string(mcpgo.MethodPing) {
		return &transport.JSONRPCResponse{JSONRPC: mcpgo.JSONRPC_VERSION, ID: req.ID, Result: json.RawMessage("{}")}, nil
	}
	if c := l.owners.latest(); c != nil && l.owned() {
		params, err := json.Marshal(req.Params)
		if err != nil {
			params = json.RawMessage("{}")
		}
		res, rpcErr := answer(ctx, *c, req.Method, params)
		return &transport.JSONRPCResponse{JSONRPC: mcpgo.JSONRPC_VERSION, ID: req.ID, Result: res, Error: rpcErr}, nil
	}
	s.opts.Logger.Debug("refused an upstream request that belongs to no call", "server", s.opts.Name, "method", req.Method)
	return &transport.JSONRPCResponse{JSONRPC: mcpgo.JSONRPC_VERSION, ID: req.ID, Error: &mcpgo.JSONRPCErrorDetails{
		Code:    mcpgo.INVALID_REQUEST,
		Message: fmt.Sprintf("capgate relays %s only on the stream of the tools/call that caused it (streamable HTTP); this one belongs to no call", req.Method),
	}}, nil
}
