package app

import (
	"context"
	"log/slog"

	"github.com/capgate/capgate/config"
	"github.com/capgate/capgate/token"
)

// oidcOptions adds auth.jwks_url or [auth.oidc] to the verifier's options
// and to the banner's list of key sources.
func oidcOptions(ctx context.Context, cfg *config.Config, vopts *token.Options, logger *slog.Logger, source *string) error {
	name := ""
	switch {
	case cfg.Auth.JWKSURL != "":
		vopts.JWKSURL = cfg.Auth.JWKSURL
		name = "JWKS " + cfg.Auth.JWKSURL
	case cfg.Auth.OIDC != nil:
		vopts.Issuer = cfg.Auth.OIDC.Issuer
		vopts.Audience = cfg.Auth.OIDC.Audience
		name = "OIDC issuer " + cfg.Auth.OIDC.Issuer
	default:
		return nil
	}
	vopts.Context = ctx // the refresh's life

	vopts.Logger = logger
	if *source != "" {
		*source += " and "
	}
	*source += name
	return nil
}
