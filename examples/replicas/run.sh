#!/usr/bin/env bash
# Starts PostgreSQL (a throwaway cluster in a temporary directory), two
# capgate serve replicas sharing it, and haproxy in front checking each
# replica's /readyz. Ctrl-C (or SIGTERM) stops them all.
#
#   go build -o /tmp/capgate ./cmd/capgate
#   CAPGATE=/tmp/capgate examples/replicas/run.sh
#
# Needs Debian's postgresql and haproxy packages. Ports: LB_PORT (8780),
# replicas REPLICA_PORT and REPLICA_PORT+1 (8781, 8782), PG_PORT (55432),
# haproxy's stats STATS_PORT (8779).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
capgate=${CAPGATE:-capgate}
lb_port=${LB_PORT:-8780}
stats_port=${STATS_PORT:-8779}
replica_port=${REPLICA_PORT:-8781}
pg_port=${PG_PORT:-55432}
pg_bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
haproxy=$(command -v haproxy || echo /usr/sbin/haproxy)

work=$(mktemp -d /tmp/capgate-replicas.XXXXXX)
pids=()
stop() {
  trap - EXIT INT TERM
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap stop EXIT INT TERM

# PostgreSQL refuses to run as root: as root, it runs as postgres.
as_pg=()
if [ "$(id -u)" = 0 ]; then
  chown postgres: "$work"
  as_pg=(runuser -u postgres --)
fi
"${as_pg[@]}" "$pg_bin/initdb" -D "$work/pg" -U postgres -A trust -E UTF8 >/dev/null
"${as_pg[@]}" "$pg_bin/postgres" -D "$work/pg" -p "$pg_port" -c listen_addresses=127.0.0.1 \
  -c unix_socket_directories="$work" >"$work/postgres.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do
  "$pg_bin/pg_isready" -q -h 127.0.0.1 -p "$pg_port" && break
  sleep 0.2
done
"$pg_bin/createdb" -h 127.0.0.1 -p "$pg_port" -U postgres capgate
echo "postgres   127.0.0.1:$pg_port (log $work/postgres.log)"

# What every replica shares: the store, its key, the token key.
export CAPGATE_STORE_URL="postgres://postgres@127.0.0.1:$pg_port/capgate?sslmode=disable"
export CAPGATE_STORE_KEY=${CAPGATE_STORE_KEY:-$(openssl rand -hex 32)}
export CAPGATE_TOKEN_SECRET=${CAPGATE_TOKEN_SECRET:-$(openssl rand -hex 32)}
# For your shell: the keys go to a private file, not the terminal.
(umask 077; printf 'export CAPGATE_TOKEN_SECRET=%s\nexport CAPGATE_URL=http://127.0.0.1:%s/rpc\n' \
  "$CAPGATE_TOKEN_SECRET" "$lb_port" >"$work/env")

servers=""
for i in 1 2; do
  port=$((replica_port + i - 1))
  mkdir -p "$work/replica$i"
  CAPGATE_LISTEN="127.0.0.1:$port" CAPGATE_DATA_DIR="$work/replica$i" \
    "$capgate" serve --config "$here/capgate.toml" >"$work/replica$i.out" 2>"$work/replica$i.log" &
  pids+=($!)
  servers+="    server r$i 127.0.0.1:$port check"$'\n'
  echo "replica r$i 127.0.0.1:$port (pid $!, log $work/replica$i.log)"
done

cat >"$work/haproxy.cfg" <<CFG
defaults
    mode http
    timeout connect 1s
    timeout client 60s
    timeout server 60s
listen stats
    bind 127.0.0.1:$stats_port
    stats enable
    stats uri /
frontend capgate
    bind 127.0.0.1:$lb_port
    default_backend replicas
backend replicas
    balance roundrobin
    # Retry only a connection that failed before the request was sent, on
    # another replica. Never retry-on empty-response: a replica that died
    # mid-call may have run the tool, and a resent POST would run it again.
    # Clients send idempotency keys instead (docs/replicas.md).
    retries 3
    retry-on conn-failure
    option redispatch 1
    option httpchk
    # HTTP/1.1 with a Host: capgate refuses a loopback request naming no host.
    http-check send meth GET uri /readyz ver HTTP/1.1 hdr Host 127.0.0.1
    default-server inter 500ms fall 2 rise 2
$servers
CFG
"$haproxy" -db -f "$work/haproxy.cfg" >"$work/haproxy.log" 2>&1 &
pids+=($!)
echo "haproxy    http://127.0.0.1:$lb_port (stats: curl -s 'http://127.0.0.1:$stats_port/;csv')"

for _ in $(seq 50); do
  curl -fsS "http://127.0.0.1:$lb_port/readyz" >/dev/null 2>&1 && break
  sleep 0.2
done
echo "ready: MCP http://127.0.0.1:$lb_port/mcp, capability RPC http://127.0.0.1:$lb_port/rpc"
echo "a token: . $work/env; $capgate token mint --sub you"
# A replica that dies (try kill -9) leaves the others serving.
wait
