package rpc

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
)

// Error is a JSON-RPC error answer.
type Error struct {
	Code    int      `json:"code"`
	Message string   `json:"message"`
	Data    *rpcData `json:"data,omitempty"`
}

func (e *Error) Error() string { return e.Message }

// Hint is what the server said would allow the call, if anything.
func (e *Error) Hint() string {
	if e.Data == nil {
		return ""
	}
	return e.Data.Hint
}

// Client calls a capgate capability RPC endpoint: an http(s) URL, or
// unix:///path/to/rpc.sock.
type Client struct {
	url    string
	client *http.Client
	id     atomic.Int64
}

// NewClient returns a client for endpoint.
func NewClient(endpoint string) (*Client, error) {
	c := &Client{url: endpoint, client: &http.Client{}}
	if path, ok := strings.CutPrefix(endpoint, "unix://"); ok {
		if path == "" {
			return nil, fmt.Errorf("%q names no socket", endpoint)
		}
		c.url = "http://capgate/rpc"
		c.client.Transport = &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}}
		return c, nil
	}
	if !strings.HasPrefix(endpoint, "http://") && !strings.HasPrefix(endpoint, "https://") {
		return nil, fmt.Errorf("%q is not an http(s):// or unix:// endpoint", endpoint)
	}
	return c, nil
}

// maxRPCAnswer bounds what the client reads of one answer: results are
// bounded by the sources' limits, well below it.
const maxRPCAnswer = 64 << 20

// Call sends one request. An error answer is returned as *Error.
func (c *Client) Call(ctx context.Context, method string, params any) (json.RawMessage, error) {
	body, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": c.id.Add(1), "method": method, "params": params})
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxRPCAnswer))
	if err != nil {
		return nil, err
	}
	var out struct {
		Result json.RawMessage `json:"result"`
		Error  *Error          `json:"error"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("%s answered %s, not JSON-RPC: %s", c.url, resp.Status, bytes.TrimSpace(b[:min(len(b), 200)]))
	}
	if out.Error != nil {
		return nil, out.Error
	}
	return out.Result, nil
}
