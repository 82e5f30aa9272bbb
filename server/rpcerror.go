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
// it is an upstream's, and says whether it did.
func writeUpstreamError(w http.ResponseWriter, id json.RawMessage, err error) bool {
	var re *mcpsrc.RPCError
	if err == nil || !errors.As(err, &re) {
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
	status := http.StatusOK
	if re.Status/100 == 4 {
		status = re.Status
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
	return true
}
