package server

import (
	"encoding/json"
	"errors"
	"net/http"

	mcpsrc "github.com/capgate/capgate/sources/mcp"
)

// An upstream's JSON-RPC error (its code, message and data, which the
// source has hardened) reaches the caller as that error, with the HTTP
// status the upstream gave it when that was a 4xx (the stateless protocol
// answers a missing client capability, -32021, with 400), rather than as
// a capgate-made tool error.

// writeUpstreamError writes err as the JSON-RPC error answering id when
// it is an upstream's, and says whether it did; modern: the caller's
// request is a stateless one.
func writeUpstreamError(w http.ResponseWriter, id json.RawMessage, err error, modern bool) bool {
	if err == nil {
		return false
	}
	re, ok := errors.AsType[*mcpsrc.RPCError](err)
	if !ok {
		return false
	}
	type details struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
		Data    any    `json:"data,omitempty"`
	}
	b, merr := json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   details         `json:"error"`
	}{"2.0", id, details{re.Code, re.Message, re.Data}})
	if merr != nil {
		return false
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(upstreamStatus(re, modern))
	w.Write(append(b, '\n'))
	return true
}

// upstreamStatus is the HTTP status of a JSON answer carrying re.
func upstreamStatus(re *mcpsrc.RPCError, modern bool) int {
	if modern && re.Status/100 == 4 {
		return re.Status
	}
	return http.StatusOK
}
