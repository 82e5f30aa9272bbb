#!/bin/sh
# The quickstart's bridge-v1 provider (namespace gog: a pretend mail and
# calendar service): the repository's test provider, built once, then run
# once per request as the bridge protocol does.
set -e
root="$(cd "$(dirname "$0")/../.." && pwd)"
bin="${TMPDIR:-/tmp}/capgate-quickstart-bridge"
if [ ! -x "$bin" ] || [ "$root/internal/testkit/bridgefixture/main.go" -nt "$bin" ]; then
	(cd "$root" && go build -o "$bin.$$" ./internal/testkit/bridgefixture && mv "$bin.$$" "$bin")
fi
exec "$bin"
