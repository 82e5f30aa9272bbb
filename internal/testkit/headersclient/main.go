// Command headersclient is the "client" the MCP conformance suite runs for
// its SEP-2243 client scenarios (http-custom-headers,
// http-invalid-tool-headers, http-standard-headers), made of capgate: it
// starts `capgate serve` (-capgate BIN, in -dir DIR) with the suite's
// scenario server (the last argument) as its one upstream (prefix ""), then
// calls through capgate as an honest 2026-07-28 client would: tools/list,
// then each call of $MCP_CONFORMANCE_CONTEXT's toolCalls, or, without
// those, every listed tool with "x" for each required string. What the
// suite checks is what capgate sends the scenario server.
//
// Null arguments are left out of a call: capgate checks arguments against
// the tool's input schema, which for the suite's tools does not allow null,
// so a call with one would stop at capgate; an absent argument is the other
// case of the same rule (no Mcp-Param header).
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/capgate/capgate/internal/paramheader"
)

const meta = `{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"headersclient","version":"1"},"io.modelcontextprotocol/clientCapabilities":{}}`

func main() {
	bin := flag.String("capgate", "", "the capgate binary")
	dir := flag.String("dir", "", "a directory for capgate's config and data")
	flag.Parse()
	if flag.NArg() < 1 || *bin == "" || *dir == "" {
		log.Fatal("usage: headersclient -capgate BIN -dir DIR SERVER_URL")
	}
	upstream := flag.Arg(flag.NArg() - 1)
	addr := freeAddr()
	run, err := os.MkdirTemp(*dir, "run")
	if err != nil {
		log.Fatal(err)
	}
	config := fmt.Sprintf(`[server]
listen = %q
data_dir = "data"
socket = "-"

[auth.anonymous]
sub = "conformance"
grants = ["rye.*"]
acknowledge = ["unrestricted", "elevated"]

[mcp.servers.s]
url = %q
prefix = ""
`, addr, upstream)
	path := filepath.Join(run, "capgate.toml")
	if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
		log.Fatal(err)
	}
	cmd := exec.Command(*bin, "serve", "--config", path)
	cmd.Dir = run
	cmd.Env = append(os.Environ(), "CAPGATE_TOKEN_SECRET=headersclient-secret-0123456789abcdef")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		log.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	base := "http://" + addr + "/mcp"

	var list struct {
		Result struct {
			Tools []struct {
				Name        string          `json:"name"`
				InputSchema json.RawMessage `json:"inputSchema"`
			} `json:"tools"`
		} `json:"result"`
	}
	// The suite gives the client 60 s (runClient's --timeout); at load 18 the
	// serve's start and its first tools/list of the upstream took over 20.
	for deadline := time.Now().Add(50 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		b, err := post(base, "tools/list", "", `{"_meta":`+meta+`}`, nil)
		if err == nil && json.Unmarshal(b, &list) == nil && len(list.Result.Tools) > 0 {
			break
		}
		if time.Now().After(deadline) {
			log.Fatalf("capgate listed no tools: %v %s", err, b)
		}
	}
	schemas := map[string]json.RawMessage{}
	for _, t := range list.Result.Tools {
		schemas[t.Name] = t.InputSchema
	}

	var ctx struct {
		ToolCalls []struct {
			Name      string         `json:"name"`
			Arguments map[string]any `json:"arguments"`
		} `json:"toolCalls"`
	}
	json.Unmarshal([]byte(os.Getenv("MCP_CONFORMANCE_CONTEXT")), &ctx)
	if len(ctx.ToolCalls) == 0 {
		for _, t := range list.Result.Tools {
			var s struct {
				Required []string `json:"required"`
			}
			json.Unmarshal(t.InputSchema, &s)
			args := map[string]any{}
			for _, r := range s.Required {
				args[r] = "x"
			}
			ctx.ToolCalls = append(ctx.ToolCalls, struct {
				Name      string         `json:"name"`
				Arguments map[string]any `json:"arguments"`
			}{t.Name, args})
		}
	}
	for _, c := range ctx.ToolCalls {
		for k, v := range c.Arguments {
			if v == nil {
				delete(c.Arguments, k)
			}
		}
		args, _ := json.Marshal(c.Arguments)
		params, _ := json.Marshal(map[string]any{"name": c.Name, "arguments": json.RawMessage(args), "_meta": json.RawMessage(meta)})
		b, err := post(base, "tools/call", c.Name, string(params), paramheader.Mirror(schemas[c.Name], args))
		fmt.Printf("tools/call %s: %v %s\n", c.Name, err, b)
	}
}

// post sends one 2026-07-28 request through capgate.
func post(base, method, name, params string, more map[string]string) ([]byte, error) {
	body := fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":%q,"params":%s}`, method, params)
	req, err := http.NewRequest(http.MethodPost, base, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("MCP-Protocol-Version", "2026-07-28")
	req.Header.Set("Mcp-Method", method)
	if name != "" {
		req.Header.Set("Mcp-Name", name)
	}
	for k, v := range more {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return bytes.TrimSpace(b), err
}

func freeAddr() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
