// Command headersfixture is an upstream MCP server, on mcp-go, whose tools
// carry x-mcp-header annotations (SEP-2243, protocol 2026-07-28), for
// capgate's tests of custom headers. It serves both protocols (2026-07-28
// and 2025-11-25) as streamable HTTP at /mcp on -http ADDR.
//
//   - test_custom_headers and test_custom_headers_null: the MCP
//     conformance suite's http-custom-headers tools, with the same input
//     schemas (string, integer and boolean parameters mirrored as
//     Mcp-Param-*, a number and a string that are not).
//   - valid_tool {region}: region is mirrored as Mcp-Param-Region.
//
// Every tool answers with the Mcp-Method, Mcp-Name and Mcp-Param-* headers
// its call came with, as a JSON object of lower-cased name to values,
// byte for byte: what capgate sent it. mcp-go checks those headers against
// the body on 2026-07-28 requests, so a call whose mirrored headers are
// wrong fails here with -32020.
//
// With -invalid, tools/list also lists the suite's http-invalid-tool-headers
// tools, whose annotations a client must refuse (empty, not a token,
// duplicate, not a string, integer or boolean); calling one of them
// answers "invalid tool called NAME", so a client that does is seen.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"log"
	"net/http"
	"strings"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
)

// customSchema is the suite's test_custom_headers input schema.
const customSchema = `{"type":"object","properties":{
"region":{"type":"string","x-mcp-header":"Region"},
"priority":{"type":"integer","x-mcp-header":"Priority"},
"verbose":{"type":"boolean","x-mcp-header":"Verbose"},
"debug":{"type":"boolean","x-mcp-header":"Debug"},
"empty_val":{"type":"string","x-mcp-header":"EmptyVal"},
"method_val":{"type":"string","x-mcp-header":"Method"},
"float_val":{"type":"number"},
"non_ascii_val":{"type":"string","x-mcp-header":"NonAscii"},
"whitespace_val":{"type":"string","x-mcp-header":"Whitespace"},
"leading_space_val":{"type":"string","x-mcp-header":"LeadingSpace"},
"trailing_space_val":{"type":"string","x-mcp-header":"TrailingSpace"},
"internal_space_val":{"type":"string","x-mcp-header":"InternalSpace"},
"control_char_val":{"type":"string","x-mcp-header":"ControlChar"},
"crlf_val":{"type":"string","x-mcp-header":"CrLf"},
"tab_val":{"type":"string","x-mcp-header":"Tab"},
"sentinel_val":{"type":"string","x-mcp-header":"Sentinel"},
"query":{"type":"string"}},
"required":["region","priority","query"]}`

const nullSchema = `{"type":"object","properties":{
"region":{"type":"string","x-mcp-header":"Region"},
"priority":{"type":"integer","x-mcp-header":"Priority"},
"verbose":{"type":"boolean","x-mcp-header":"Verbose"},
"query":{"type":"string"}},
"required":["region","priority","query"]}`

const validSchema = `{"type":"object","properties":{"region":{"type":"string","x-mcp-header":"Region"}},"required":["region"]}`

// invalid are the suite's tools whose x-mcp-header annotations a client
// must refuse, by name: their input schemas.
var invalid = map[string]string{
	"invalid_empty_header":        `{"type":"object","properties":{"value":{"type":"string","x-mcp-header":""}},"required":["value"]}`,
	"invalid_object_header":       `{"type":"object","properties":{"data":{"type":"object","x-mcp-header":"Data"}},"required":["data"]}`,
	"invalid_array_header":        `{"type":"object","properties":{"items":{"type":"array","items":{"type":"string"},"x-mcp-header":"Items"}},"required":["items"]}`,
	"invalid_null_header":         `{"type":"object","properties":{"nil":{"type":"null","x-mcp-header":"Nil"}},"required":["nil"]}`,
	"invalid_number_header":       `{"type":"object","properties":{"score":{"type":"number","x-mcp-header":"Score"}},"required":["score"]}`,
	"invalid_duplicate_same_case": `{"type":"object","properties":{"field1":{"type":"string","x-mcp-header":"Region"},"field2":{"type":"string","x-mcp-header":"Region"}},"required":["field1","field2"]}`,
	"invalid_duplicate_diff_case": `{"type":"object","properties":{"field1":{"type":"string","x-mcp-header":"MyField"},"field2":{"type":"string","x-mcp-header":"myfield"}},"required":["field1","field2"]}`,
	"invalid_space_in_name":       `{"type":"object","properties":{"value":{"type":"string","x-mcp-header":"My Region"}},"required":["value"]}`,
	"invalid_colon_in_name":       `{"type":"object","properties":{"value":{"type":"string","x-mcp-header":"Region:Primary"}},"required":["value"]}`,
	"invalid_non_ascii_name":      `{"type":"object","properties":{"value":{"type":"string","x-mcp-header":"Région"}},"required":["value"]}`,
	"invalid_control_char_name":   `{"type":"object","properties":{"value":{"type":"string","x-mcp-header":"Region\t1"}},"required":["value"]}`,
}

func main() {
	addr := flag.String("http", "127.0.0.1:0", "serve streamable HTTP at /mcp on this address")
	withInvalid := flag.Bool("invalid", false, "also list tools with invalid x-mcp-header annotations")
	flag.Parse()
	opts := []server.ServerOption{server.WithToolCapabilities(false)}
	if *withInvalid {
		// mcp-go refuses to register such tools, so they join the list here.
		opts = append(opts, server.WithToolFilter(func(_ context.Context, tools []mcp.Tool) []mcp.Tool {
			for name, schema := range invalid {
				tools = append(tools, mcp.Tool{Name: name, Description: "an invalid x-mcp-header annotation", RawInputSchema: json.RawMessage(schema)})
			}
			return tools
		}))
	}
	s := server.NewMCPServer("headersfixture", "1", opts...)
	for name, schema := range map[string]string{"test_custom_headers": customSchema, "test_custom_headers_null": nullSchema, "valid_tool": validSchema} {
		s.AddTool(mcp.Tool{Name: name, Description: "Answers with the Mcp-* headers it was called with.", RawInputSchema: json.RawMessage(schema)}, echoHeaders)
	}
	next := server.NewStreamableHTTPServer(s)
	mux := http.NewServeMux()
	mux.Handle("/mcp", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if name, ok := invalidCall(r); ok {
			w.Header().Set("Content-Type", "application/json")
			b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": json.RawMessage(name[1]),
				"result": map[string]any{"content": []any{map[string]any{"type": "text", "text": "invalid tool called " + name[0]}}}})
			w.Write(b)
			return
		}
		next.ServeHTTP(w, r)
	}))
	log.Fatal(http.ListenAndServe(*addr, mux))
}

// echoHeaders answers with the Mcp-* headers of its request.
func echoHeaders(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	got := map[string][]string{}
	for k, v := range req.Header {
		if k := strings.ToLower(k); strings.HasPrefix(k, "mcp-param-") || k == "mcp-method" || k == "mcp-name" {
			got[k] = v
		}
	}
	b, err := json.Marshal(got)
	if err != nil {
		return nil, err
	}
	return mcp.NewToolResultText(string(b)), nil
}

// invalidCall says whether r is a tools/call of an invalid tool, and
// gives its name and request id.
func invalidCall(r *http.Request) ([2]string, bool) {
	if r.Method != http.MethodPost || r.Body == nil {
		return [2]string{}, false
	}
	body, err := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	if err != nil {
		return [2]string{}, false
	}
	var msg struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
		Params struct {
			Name string `json:"name"`
		} `json:"params"`
	}
	if json.Unmarshal(body, &msg) != nil || msg.Method != "tools/call" {
		return [2]string{}, false
	}
	if _, ok := invalid[msg.Params.Name]; !ok {
		return [2]string{}, false
	}
	return [2]string{msg.Params.Name, string(msg.ID)}, true
}
