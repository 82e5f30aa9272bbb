#!/usr/bin/env bash
# A/B of two capgate builds on one machine: capgate's CPU per call at
# concurrency 1 (what capgate bench reads from /proc), each build serving
# the MCP fixture over streamable HTTP with a signed token, rounds
# interleaved and the order alternating, pooled per protocol. Run it with
# the same binary twice first (an A/A run): the spread it shows is the
# noise a difference must beat.
#   bash cmd/capgate/ab.sh A B [ROUNDS] [CALLS]
# A and B are capgate binaries, e.g.
#   go build -o /tmp/a ./cmd/capgate; git stash; go build -o /tmp/b ./cmd/capgate
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 2 ] || { echo "usage: bash cmd/capgate/ab.sh A B [ROUNDS] [CALLS]" >&2; exit 2; }
rounds=${3:-10}
calls=${4:-2000}
w=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$w"; }
trap cleanup EXIT
mkdir -p "$w/bin"
# Copies, so that neither build shares its code's pages with the other or
# with the client (a shared file warms caches for whoever runs it).
cp "$1" "$w/bin/a"
cp "$2" "$w/bin/b"
cp "$1" "$w/bin/client"
go build -o "$w/bin/mcpfixture" ./internal/testkit/mcpfixture

port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
wait_port() { # up to 30 s for a listener on port $1
  for _ in $(seq 1 300); do (echo >"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done
  echo "ab.sh: nothing listens on port $1" >&2
  return 1
}
up=$(port)
"$w/bin/mcpfixture" -http "127.0.0.1:$up" >"$w/fixture.log" 2>&1 &
pids+=($!)
wait_port "$up"
declare -A PORT PID TOK
for b in a b; do
  PORT[$b]=$(port)
  mkdir -p "$w/$b"
  cat >"$w/$b/capgate.toml" <<EOF
[server]
listen = "127.0.0.1:${PORT[$b]}"
data_dir = "$w/$b/data"
socket = "-"
[policy]
grants = ["rye.execute.tool.mcp.fx.*"]
[mcp.servers.fx]
url = "http://127.0.0.1:$up/mcp"
[mcp.servers.fx.tools.t_00]
risk = "LOW"
EOF
  "$w/bin/$b" serve --config "$w/$b/capgate.toml" >"$w/$b/out.log" 2>"$w/$b/err.log" &
  PID[$b]=$!
  pids+=(${PID[$b]})
  wait_port "${PORT[$b]}"
  TOK[$b]=$("$w/bin/client" token mint --config "$w/$b/capgate.toml" --sub ab --ttl 1h 2>/dev/null)
done

for protocol in 2025-11-25 2026-07-28; do
  for r in $(seq 1 "$rounds"); do
    order="a b"
    [ $((r % 2)) = 0 ] && order="b a" # neither always goes first
    for b in $order; do
      us=$("$w/bin/client" bench --token "${TOK[$b]}" --direct "http://127.0.0.1:$up/mcp" --direct-tool t_00 \
        --through "http://127.0.0.1:${PORT[$b]}/mcp" --through-tool fx__t_00 \
        --protocol "$protocol" --calls "$calls" --concurrency 1 --pid "${PID[$b]}" --json |
        python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["capgate_cpu_per_call_us"])')
      echo "$protocol $b $us"
    done
  done
done >"$w/ab.txt"
python3 - "$w/ab.txt" <<'EOF'
import collections, sys
cpu = collections.defaultdict(list)
for line in open(sys.argv[1]):
    protocol, build, us = line.split()
    cpu[protocol, build].append(float(us))
for protocol in sorted({p for p, _ in cpu}):
    a, b = cpu[protocol, "a"], cpu[protocol, "b"]
    print(f"{protocol}: capgate CPU per call at concurrency 1 over {len(a)} rounds: "
          f"A {sum(a)/len(a):.0f} µs, B {sum(b)/len(b):.0f} µs, B/A {sum(b)/sum(a):.3f}; "
          "per round " + " ".join(f"{y/x:.2f}" for x, y in zip(a, b)))
EOF
