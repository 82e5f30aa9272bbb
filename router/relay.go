package router

import (
	"context"
	"encoding/json"
	"log/slog"

	"github.com/capgate/capgate/harden"
	"github.com/capgate/capgate/tool"
)

// relayed wraps what a source sends the caller while the call runs (log
// messages, progress text, requests of the client such as sampling) in
// the same check as its result: they are upstream bytes on their way to a
// caller. A log message that fails it is dropped, a progress message loses
// its text, and a request of the client is refused to the upstream; the
// operator's log names what was found, never the value.
func relayed(call *tool.Call, d *tool.Descriptor, logger *slog.Logger) {
	if log := call.Log; log != nil {
		call.Log = func(params json.RawMessage) {
			if f, ok := harden.JSON(params); ok {
				logger.Warn("withheld an upstream log message", "tool", d.ID, "found", f)
				return
			}
			log(params)
		}
	}
	if progress := call.Progress; progress != nil {
		call.Progress = func(p, total float64, message string) {
			if f, ok := harden.Message(message); ok {
				logger.Warn("withheld an upstream progress message", "tool", d.ID, "found", f)
				message = ""
			}
			progress(p, total, message)
		}
	}
	if ask := call.Ask; ask != nil {
		call.Ask = func(ctx context.Context, method string, params json.RawMessage) (json.RawMessage, error) {
			if f, ok := harden.JSON(params); ok {
				logger.Warn("refused an upstream request of the client", "tool", d.ID, "method", method, "found", f)
				return nil, harden.Withheld(d.ID+"'s "+method+" request", f)
			}
			return ask(ctx, method, params)
		}
	}
}
