#!/bin/sh
# Serves the quickstart: builds the two programs it runs as tools (capgate
# runs tools as an unprivileged user, nobody under root, who cannot use
# your Go caches for go run), then starts capgate on capgate.toml.
set -e
cd "$(dirname "$0")/../.."
go build -o examples/quickstart/bin/ ./internal/testkit/mcpfixture ./internal/testkit/bridgefixture
exec go run ./cmd/capgate serve --config examples/quickstart/capgate.toml "$@"
