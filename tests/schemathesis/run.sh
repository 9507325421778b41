#!/usr/bin/env bash
# Schemathesis against a live coordinator (issue 17): docs/openapi.json must state what the
# server enforces. Starts three reference participants and a coordinator from the debug binary
# on loopback with authentication on (client, operator, peer and metrics tokens made here, so
# the tested path is the secure one), runs `st run docs/openapi.json --checks all` (but
# use_after_free) with a fixed seed, a bounded number of examples per operation and a
# per-request timeout, stops every server it started whatever happens, and exits non-zero on
# any failure. About 2 minutes (the install from PyPI included, 40 s of it, once per fresh
# target/).
#
# Usage: tests/schemathesis/run.sh   (uses target/debug/twopc, built by `cargo test`; builds it
#        when absent. After changing the code, `cargo build` first: the script does not, so
#        that CI does not rebuild what `cargo test` just built.)
# Env: TWOPC_BIN (default target/debug/twopc), ST_VENV (default target/schemathesis-venv),
#      ST_MAX_EXAMPLES (default 50), ST_SEED (default 17).
#
# The settings (the token for each security scheme, read from the environment) are in
# schemathesis.toml beside this file; hooks.py maps generated participant names onto the ones
# this cluster has (deployment data JSON Schema cannot state) in schema-valid requests only.
#
# What each check covers here (all of them run; two are off for one operation, below):
# - not_a_server_error, status_code_conformance, content_type_conformance,
#   response_headers_conformance, response_schema_conformance: every answer, errors included,
#   is documented with its status, `error` code, headers (Retry-After, WWW-Authenticate) and body.
# - positive_data_acceptance / negative_data_rejection: what the document allows is accepted
#   (or refused only for state: 404, 409), what it forbids is refused.
# - missing_required_header: the only required header is Authorization (a security scheme):
#   without it, 401.
# - ignored_auth: each route's documented security is enforced: the same request without a
#   token, or with a wrong one, is 401.
# - unsupported_method, allow_header_conformance: other methods are 405 with `Allow`.
# - use_after_free, ensure_resource_availability: leases are the one resource with a DELETE.
#   use_after_free is off (--exclude-checks below): a release ends one grant (name and token),
#   answers 200 even when that grant had already ended, and the name may be held by a newer
#   grant; schemathesis.toml says why. Switched off for GET /v1/leases/{name} only in the config,
#   the stateful phase still ran it there (it failed CI on 2026-12-07: a release with a stale
#   token, 200 `released: false`, then the name read 200 under another holder's grant); on the
#   command line nothing outranks the switch, and no other operation has a DELETE before it. A
#   released grant reading 404 is tests_leases.rs.
#   ensure_resource_availability is off there too: a lease ends by itself when its TTL (100 ms
#   at the least) passes, so a read-back after it is 404 by design.
# - object_level_authorization: inapplicable, and a no-op without several identities' objects
#   (auth.wfc peers): every client token may read every transaction, saga and lease by design
#   (docs/security.md, "No per-client authorization of data").
set -euo pipefail
cd "$(dirname "$0")/../.."

SCHEMATHESIS_VERSION=4.32.5
bin="${TWOPC_BIN:-target/debug/twopc}"
venv="${ST_VENV:-target/schemathesis-venv}"
max_examples="${ST_MAX_EXAMPLES:-50}"
seed="${ST_SEED:-17}"

if [ ! -x "$bin" ]; then
    cargo build --quiet --bin twopc
fi

if [ ! -x "$venv/bin/st" ] || [ "$("$venv/bin/st" --version 2>/dev/null)" != "st, version $SCHEMATHESIS_VERSION" ]; then
    rm -rf "$venv"
    if ! python3 -m venv "$venv"; then
        # Debian's python3 splits venv out.
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq python3-venv >/dev/null
        python3 -m venv "$venv"
    fi
    "$venv/bin/pip" install --quiet --disable-pip-version-check "schemathesis==$SCHEMATHESIS_VERSION"
fi
python="$venv/bin/python"

work="$(mktemp -d /tmp/twopc-schemathesis.XXXXXX)"
chmod 700 "$work"
pids=()
stop_servers() {
    local status=$?
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${pids[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    if [ "$status" -ne 0 ]; then
        for log in "$work"/*.log; do
            [ -f "$log" ] || continue
            echo "--- last lines of $log"
            tail -n 20 "$log"
        done
    fi
    rm -rf "$work"
    exit "$status"
}
trap stop_servers EXIT
trap 'exit 130' INT TERM

# Tokens: random, in files only (never on a command line, never printed).
token() { "$python" -c 'import secrets; print(secrets.token_urlsafe(32))'; }
client_token="$(token)"
operator_token="$(token)"
peer_token="$(token)"
metrics_token="$(token)"
( umask 077
  printf 'schemathesis-client %s\n' "$client_token" > "$work/client.tokens"
  printf 'schemathesis-operator %s\n' "$operator_token" > "$work/operator.tokens"
  printf '%s\n' "$peer_token" > "$work/peer.tokens"
  printf '%s\n' "$metrics_token" > "$work/metrics.tokens" )
# schemathesis.toml reads them from the environment.
export TWOPC_ST_CLIENT_TOKEN="$client_token" TWOPC_ST_OPERATOR_TOKEN="$operator_token"
export TWOPC_ST_PEER_TOKEN="$peer_token" TWOPC_ST_METRICS_TOKEN="$metrics_token"

# Five free loopback ports (the OS picks them; released just before the servers bind).
read -r coordinator_port p1 p2 p3 <<<"$("$python" - <<'PY'
import socket
socks = [socket.socket() for _ in range(4)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
for s in socks:
    s.close()
PY
)"
coordinator_url="http://127.0.0.1:$coordinator_port"
names=(inventory payments shipping)
ports=("$p1" "$p2" "$p3")

participant_flags=()
for i in 0 1 2; do
    name="${names[$i]}"
    port="${ports[$i]}"
    "$bin" participant --name "$name" --listen "127.0.0.1:$port" --data-dir "$work/$name" \
        --coordinator "$coordinator_url" --peer-token-file "$work/peer.tokens" \
        >"$work/$name.log" 2>&1 &
    pids+=("$!")
    participant_flags+=(--participant "$name=http://127.0.0.1:$port")
done
"$bin" coordinator --listen "127.0.0.1:$coordinator_port" --data-dir "$work/coordinator" \
    "${participant_flags[@]}" \
    --client-token-file "$work/client.tokens" --operator-token-file "$work/operator.tokens" \
    --peer-token-file "$work/peer.tokens" --metrics-token-file "$work/metrics.tokens" \
    --prepare-timeout-ms 2000 \
    >"$work/coordinator.log" 2>&1 &
pids+=("$!")

# Ready when /readyz answers 200 (it is open); give up after 30 s.
"$python" - "$coordinator_url/readyz" <<'PY'
import sys, time, urllib.request
deadline = time.time() + 30
while True:
    try:
        with urllib.request.urlopen(sys.argv[1], timeout=2) as answer:
            if answer.status == 200:
                break
    except Exception:
        pass
    if time.time() > deadline:
        sys.exit("the coordinator did not become ready within 30 s")
    time.sleep(0.2)
PY

export SCHEMATHESIS_HOOKS="$PWD/tests/schemathesis/hooks.py" TWOPC_ST_PARTICIPANTS="$(IFS=,; echo "${names[*]}")"
started=$(date +%s)
status=0
"$venv/bin/st" --config-file tests/schemathesis/schemathesis.toml run docs/openapi.json \
    --url "$coordinator_url" --checks all --exclude-checks use_after_free \
    --seed "$seed" --max-examples "$max_examples" --request-timeout 10 \
    --no-color || status=$?
echo "schemathesis: exit $status after $(( $(date +%s) - started )) s"
exit "$status"
