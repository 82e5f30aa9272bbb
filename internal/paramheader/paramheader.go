// Package paramheader is custom headers from tool parameters (SEP-2243,
// protocol 2026-07-28): a property of a tool's inputSchema may carry
// "x-mcp-header": NAME, and a tools/call of that tool over streamable HTTP
// then carries the argument in the header Mcp-Param-NAME as well as in the
// body, so that balancers and gateways can route on it without reading the
// body. A client mirrors the arguments (Mirror); a server checks that the
// headers and the body agree (Check); a tool whose annotations break the
// rules is refused by clients and servers alike (Valid).
//
// The encoding and the checks are mcp-go's (mcp.GenerateParamHeaders,
// mcp.ValidateParamHeadersLookup, mcp.ValidateParamHeaderAnnotations);
// this package adds what mcp-go leaves out: an annotation the rules cannot
// reach (under items, oneOf, $defs, ...) makes a tool invalid, where
// mcp-go ignores it.
package paramheader

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/mark3labs/mcp-go/mcp"
)

// Key is the annotation's name in a property schema.
const Key = "x-mcp-header"

// Prefix begins every header that carries a parameter.
const Prefix = mcp.HeaderParamPrefix

var key = []byte(`"` + Key + `"`)

// Annotated says whether schema may carry an annotation: a byte search,
// so that the tools without any cost nothing more.
func Annotated(schema json.RawMessage) bool { return bytes.Contains(schema, key) }

// Valid says why the annotations of an input schema are invalid, or nil
// when they are valid (or there are none). Invalid: an annotation that is
// not a non-empty HTTP token (no spaces, colons, control or non-ASCII
// characters), two that are equal ignoring case, one on a property whose
// type is not string, integer or boolean, and one that is not on a
// property reached from the root through "properties" alone.
func Valid(schema json.RawMessage) error {
	if !Annotated(schema) {
		return nil
	}
	if err := mcp.ValidateParamHeaderAnnotations(&mcp.Tool{RawInputSchema: schema}); err != nil {
		return err
	}
	var root any
	if err := json.Unmarshal(schema, &root); err != nil {
		return fmt.Errorf("the input schema is not JSON: %v", err)
	}
	return reachable(root, "", true)
}

// reachable checks that every annotation under v (a schema at path) sits
// on a property reached through "properties" alone; chain says v is one
// (or the root).
func reachable(v any, path string, chain bool) error {
	switch v := v.(type) {
	case map[string]any:
		if _, ok := v[Key]; ok && (!chain || path == "") {
			where := path
			if where == "" {
				where = "the root"
			}
			return fmt.Errorf("%s: x-mcp-header is allowed only on a property reached through \"properties\" from the root", where)
		}
		for k, sub := range v {
			if dataKeyword[k] {
				continue // values, not schemas: an "x-mcp-header" in them annotates nothing
			}
			if props, ok := sub.(map[string]any); ok && k == "properties" {
				for name, p := range props {
					if err := reachable(p, join(path, name), chain); err != nil {
						return err
					}
				}
				continue
			}
			if err := reachable(sub, join(path, k), false); err != nil {
				return err
			}
		}
	case []any:
		for i, sub := range v {
			if err := reachable(sub, fmt.Sprintf("%s[%d]", path, i), false); err != nil {
				return err
			}
		}
	}
	return nil
}

// dataKeyword: schema keywords whose values are instances, not schemas.
var dataKeyword = map[string]bool{"const": true, "default": true, "enum": true, "examples": true}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

// Mirror is the Mcp-Param-* headers of a call with args (a JSON object)
// to a tool with schema: each annotated argument that is present, not
// null and a string, an integer or a boolean, encoded as the specification
// says (as it is when it is printable ASCII without surrounding spaces,
// else =?base64?...?=). nil when there are none.
func Mirror(schema, args json.RawMessage) map[string]string {
	if !Annotated(schema) || len(args) == 0 {
		return nil
	}
	return mcp.GenerateParamHeaders(&mcp.Tool{RawInputSchema: schema}, wrapArgs(args))
}

// wrapArgs is tools/call params holding args, as mcp-go reads them.
func wrapArgs(args json.RawMessage) json.RawMessage {
	params := make([]byte, 0, len(args)+16)
	return append(append(append(params, `{"arguments":`...), args...), '}')
}

// Check says whether the Mcp-Param-* headers h of a tools/call with args
// agree with the body, for a tool with schema: each annotated argument
// that is present and not null needs its header, whose value (decoded
// from =?base64?...?= when it is wrapped so, invalid base64 refused)
// equals the argument; a header for an argument that is absent or null
// is refused too. required false checks only the headers that came: a
// client of a revision before 2026-07-28 sends none. The error is an
// mcp.HeaderMismatchError naming the header: JSON-RPC -32020, HTTP 400.
func Check(h http.Header, schema, args json.RawMessage, required bool) error {
	if !Annotated(schema) || len(args) == 0 {
		// No arguments: nothing to compare, as mcp-go has it.
		return nil
	}
	var mirrored map[string]string
	if !required {
		// A header that did not come is taken as the one the body makes.
		mirrored = Mirror(schema, args)
	}
	return mcp.ValidateParamHeadersLookup(func(name string) (string, bool) {
		// net/http took the spaces around the value off already.
		if v := h.Values(name); len(v) > 0 {
			return v[0], true
		}
		v, ok := mirrored[name]
		return v, ok
	}, &mcp.Tool{RawInputSchema: schema}, wrapArgs(args))
}
