package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/capgate/capgate/app"
	"github.com/capgate/capgate/config"
	"github.com/capgate/capgate/token"
)

// The environment variables the token secret is read from.
const (
	tokenSecretEnv    = "CAPGATE_TOKEN_SECRET"
	ashTokenSecretEnv = "ASH_CONTEXT_TOKEN_SECRET"
)

func newTokenCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "token",
		Short: "Mint context tokens",
		Long: `token works with capgate's context tokens: Ash context tokens (typ
ASH_CONTEXT) and standard HS256 JWTs, signed with the shared secret.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newTokenMintCmd())
	return cmd
}

type tokenMintOptions struct {
	sub       string
	chatType  string
	chatID    string
	caps      []string
	acks      []string
	aud       string
	ttl       time.Duration
	ash       bool
	secretEnv string
	config    string
	json      bool
}

func newTokenMintCmd() *cobra.Command {
	var o tokenMintOptions
	cmd := &cobra.Command{
		Use:   "mint --sub SUBJECT [flags]",
		Short: "Mint a signed context token",
		Long: `mint signs a context token for --sub with the shared secret (HS256) and prints
it on stdout, and on stderr when it expires. The token expires after --ttl. --caps and --ack set capgate's claims: the
capability patterns the token allows and the risk tiers it acknowledges.

The secret is read from the environment variable --secret-env names
(` + tokenSecretEnv + `; when that is unset, ` + ashTokenSecretEnv + `), as hex,
base64url or raw text, the way Ash reads it.

With --config the secret is the one that config's server uses: the variable its
[auth] secret_env names, else the development key capgate serve made in its
data directory.

With --ash the token is an Ash context token (typ ASH_CONTEXT, ver 1), byte
for byte as Ash mints it; otherwise it is a standard JWT.

Exit status: 0 minted, 2 bad input or no secret.`,
		Example: `  CAPGATE_TOKEN_SECRET=$(openssl rand -hex 32) capgate token mint --sub alice --caps 'rye.execute.tool.mcp.filesystem.*'
  capgate token mint --ash --sub telegram:42 --chat-type private --chat-id 42 --ack elevated --ttl 10m`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runTokenMint(cmd.OutOrStdout(), cmd.ErrOrStderr(), o, cmd.Flags().Changed("secret-env"))
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.sub, "sub", "", "the subject: the caller's identity (required)")
	f.StringVar(&o.chatType, "chat-type", "", "the chat_type claim")
	f.StringVar(&o.chatID, "chat-id", "", "the chat_id claim")
	f.StringArrayVar(&o.caps, "caps", nil, "a capability pattern the token allows (repeatable)")
	f.StringArrayVar(&o.acks, "ack", nil, "an acknowledged risk tier (repeatable)")
	f.StringVar(&o.aud, "aud", "", "the audience (aud claim)")
	f.DurationVar(&o.ttl, "ttl", token.DefaultTTL, "how long the token is valid")
	f.BoolVar(&o.ash, "ash", false, "mint an Ash context token (typ ASH_CONTEXT) instead of a JWT")
	f.StringVar(&o.secretEnv, "secret-env", tokenSecretEnv, "the environment variable holding the secret")
	f.StringVar(&o.config, "config", "", "read the secret as this capgate.toml's server does")
	f.BoolVar(&o.json, "json", false, `print one JSON object on stdout: {"token","sub","expires_at"}`)
	return cmd
}

func runTokenMint(out, errOut io.Writer, o tokenMintOptions, explicitEnv bool) error {
	if strings.TrimSpace(o.sub) == "" {
		return usageError("--sub is required and must not be blank")
	}
	if o.ttl <= 0 {
		return usageError("--ttl %v: must be positive", o.ttl)
	}
	if strings.TrimSpace(o.secretEnv) == "" {
		return usageError("--secret-env is blank")
	}
	for _, c := range o.caps {
		if strings.TrimSpace(c) == "" {
			return usageError("--caps: a capability pattern is blank")
		}
	}
	for _, a := range o.acks {
		if strings.TrimSpace(a) == "" {
			return usageError("--ack: a tier is blank")
		}
	}
	var secret []byte
	if o.config != "" {
		cfg, err := config.Load(o.config)
		if err != nil {
			return usageError("%v", err)
		}
		if secret, _, err = app.Secret(cfg, os.LookupEnv); err != nil {
			return usageError("%v", err)
		}
	} else {
		secret = token.ParseSecret(os.Getenv(o.secretEnv))
	}
	if secret == nil {
		if explicitEnv {
			return usageError("no token secret: %s is unset or blank", o.secretEnv)
		}
		secret = token.ParseSecret(os.Getenv(ashTokenSecretEnv))
		if secret == nil {
			return usageError("no token secret: set %s (or %s), as hex, base64url or text, or pass --config with the "+
				"capgate.toml of the capgate serve the token is for: it then mints with that server's key, the development key "+
				"serve made in its data directory included", tokenSecretEnv, ashTokenSecretEnv)
		}
	}
	// The times are set here so the expiry line says what the token says
	// (whole seconds, as the claims hold them).
	now := time.Now().Truncate(time.Second)
	c := token.Claims{
		IssuedAt:  now,
		ExpiresAt: now.Add(o.ttl),
		Sub:       o.sub,
		ChatType:  o.chatType,
		ChatID:    o.chatID,
		Caps:      o.caps,
		Ack:       o.acks,
	}
	if o.aud != "" {
		c.Audience = []string{o.aud}
	}
	tok, err := token.Mint(secret, c, token.MintOptions{Ash: o.ash, TTL: o.ttl})
	if err != nil {
		return usageError("%v", err)
	}
	if o.json {
		return json.NewEncoder(out).Encode(map[string]any{"token": tok, "sub": c.Sub, "expires_at": c.ExpiresAt.UTC()})
	}
	if _, err = fmt.Fprintln(out, tok); err != nil {
		return err
	}
	// On stderr, so `$(capgate token mint ...)` still captures the token alone.
	_, err = fmt.Fprintf(errOut, "token expires %s (in %s)\n", c.ExpiresAt.UTC().Format(time.RFC3339), o.ttl)
	return err
}
