package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/capgate/capgate/config"
	"github.com/capgate/capgate/rpc"
	"github.com/capgate/capgate/tool"
)

// DefaultRPCURL is where `capgate serve` answers with the default config.
const DefaultRPCURL = "http://127.0.0.1:8787/rpc"

func newCapabilityCmd() *cobra.Command {
	var url, configPath string
	cmd := &cobra.Command{
		Use:   "capability",
		Short: "Call a capgate capability RPC endpoint",
		Long: `capability speaks the capability RPC of a running capgate. The caller's token
comes from ASH_CONTEXT_TOKEN (or CAPGATE_TOKEN); the endpoint from --url, else
CAPGATE_URL, else the [server] listen of --config's capgate.toml (or
CAPGATE_LISTEN), else ` + DefaultRPCURL + `. An endpoint may be unix:///path/rpc.sock.`,
	}
	cmd.PersistentFlags().StringVar(&url, "url", "", "the RPC endpoint (default $CAPGATE_URL or "+DefaultRPCURL+")")
	cmd.PersistentFlags().StringVar(&configPath, "config", "", "find the running capgate by this capgate.toml's [server] listen")
	cmd.PersistentFlags().Bool("json", false, `fail with one {"error":{"code","message","hint"}} line on stderr (the answer is JSON already)`)
	call := func(cmd *cobra.Command, method string, params map[string]any) error {
		endpoint := url
		if endpoint == "" {
			endpoint = os.Getenv("CAPGATE_URL")
		}
		if endpoint == "" && configPath != "" {
			cfg, err := config.Load(configPath)
			if err != nil {
				return usageError("%v", err)
			}
			addr := cfg.Server.Listen
			if a, _ := listenOverride(""); a != "" {
				addr = a
			}
			endpoint = "http://" + dialable(addr) + "/rpc"
		}
		if endpoint == "" {
			endpoint = DefaultRPCURL
		}
		client, err := rpc.NewClient(endpoint)
		if err != nil {
			return usageError("%v", err)
		}
		tok := os.Getenv("ASH_CONTEXT_TOKEN")
		if tok == "" {
			tok = os.Getenv("CAPGATE_TOKEN")
		}
		if tok == "" {
			return usageError("no token: set ASH_CONTEXT_TOKEN or CAPGATE_TOKEN (capgate token mint makes one)")
		}
		params["context_token"] = tok
		res, err := client.Call(context.Background(), method, params)
		var rpcErr *rpc.Error
		if errors.As(err, &rpcErr) {
			if jsonOutput(cmd) && rpcErr.Data != nil && rpcErr.Data.Code != "" {
				// The stable code, the server's message and its hint.
				return &exitError{code: exitDenied, err: &tool.Error{Code: rpcErr.Data.Code,
					Message: strings.TrimPrefix(rpcErr.Message, string(rpcErr.Data.Code)+": "), Hint: rpcErr.Hint()}}
			}
			msg := rpcErr.Message
			if h := rpcErr.Hint(); h != "" {
				msg += "\n  to allow it: " + h
			}
			return &exitError{code: exitDenied, err: errors.New(msg)}
		}
		if err != nil {
			return &exitError{code: exitDenied, err: err}
		}
		var pretty bytes.Buffer
		if json.Indent(&pretty, res, "", "  ") != nil {
			pretty.Write(res)
		}
		fmt.Fprintln(cmd.OutOrStdout(), pretty.String())
		return nil
	}

	var includeUnavailable bool
	list := &cobra.Command{
		Use: "list", Short: "List the capabilities the token may see", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(cmd, "capability.list", map[string]any{"include_unavailable": includeUnavailable})
		},
	}
	list.Flags().BoolVar(&includeUnavailable, "include-unavailable", false, "also list capabilities this caller cannot call now (source down, quarantined, or not in this chat), with the reason")

	var capID, op, inputJSON, idemKey, account string
	invoke := &cobra.Command{
		Use: "invoke", Short: "Invoke one operation of a capability", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if strings.TrimSpace(capID) == "" {
				return usageError("--capability is required")
			}
			var input json.RawMessage
			if inputJSON != "" {
				if !json.Valid([]byte(inputJSON)) {
					return usageError("--input-json is not valid JSON")
				}
				input = json.RawMessage(inputJSON)
			}
			p := map[string]any{"capability": capID, "operation": op, "input": input}
			if idemKey != "" {
				p["idempotency_key"] = idemKey
			}
			if account != "" {
				p["account"] = account
			}
			return call(cmd, "capability.invoke", p)
		},
	}
	invoke.Flags().StringVar(&capID, "capability", "", "capability id (gog.email) or tool id (mcp:demo:echo)")
	invoke.Flags().StringVar(&op, "operation", "", "the operation (bridge capabilities)")
	invoke.Flags().StringVar(&inputJSON, "input-json", "{}", "the input, a JSON object")
	invoke.Flags().StringVar(&idemKey, "idempotency-key", "", "replay protection for mutating operations")
	invoke.Flags().StringVar(&account, "account", "", "the linked account to use")

	auth := &cobra.Command{Use: "auth", Short: "Link an account to a capability"}
	var beginCap, beginAccount string
	begin := &cobra.Command{
		Use: "begin", Short: "Begin an auth flow", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if strings.TrimSpace(beginCap) == "" {
				return usageError("--capability is required")
			}
			return call(cmd, "capability.auth.begin", map[string]any{"capability": beginCap, "account_hint": beginAccount})
		},
	}
	begin.Flags().StringVar(&beginCap, "capability", "", "capability id, such as gog.email")
	begin.Flags().StringVar(&beginAccount, "account", "", "a hint for the account to link")
	var flowID, callbackURL, code string
	complete := &cobra.Command{
		Use: "complete", Short: "Complete an auth flow", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if strings.TrimSpace(flowID) == "" {
				return usageError("--flow-id is required")
			}
			if (callbackURL == "") == (code == "") {
				return usageError("give exactly one of --callback-url and --code")
			}
			p := map[string]any{"flow_id": flowID}
			if callbackURL != "" {
				p["callback_url"] = callbackURL
			} else {
				p["code"] = code
			}
			return call(cmd, "capability.auth.complete", p)
		},
	}
	complete.Flags().StringVar(&flowID, "flow-id", "", "the flow id auth begin returned")
	complete.Flags().StringVar(&callbackURL, "callback-url", "", "the URL the provider redirected to")
	complete.Flags().StringVar(&code, "code", "", "the code, when there is no callback URL")
	auth.AddCommand(begin, complete)
	cmd.AddCommand(list, invoke, auth)
	return cmd
}

// dialable is a listen address as a client dials it: a wildcard host
// (":8787", "0.0.0.0:8787", "[::]:8787") is this machine's loopback.
func dialable(listen string) string {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return listen
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}
