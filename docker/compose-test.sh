#!/usr/bin/env bash
# The compose test: the demo cluster in real containers, under load, through node loss and a
# network partition, then a full stop/start from its volumes. Run by .ci/run; needs the Docker
# daemon and docker compose (v2 plugin) or docker-compose (v1.29). Pulls nothing.
#
#   docker/compose-test.sh            # builds the images offline first (docker/build-offline.sh)
#   TWOPC_SKIP_BUILD=1 docker/compose-test.sh   # reuse the twopc:latest image already built
#
# Steps: offline build; cluster up and healthy (the `tokens` service wrote the token files into
# their volume once; every service starts with them); without the operator token the API answers
# 401, with it (copied out of the volume) curl and `twopc ctl` get answers; the loadgen container starts the checkout workload;
# during it: `docker kill` the coordinator and start it again, `docker kill` a participant
# (inventory) and start it again, `docker network disconnect` a participant (payments) for a few
# seconds and reconnect it; the loadgen must exit 0 (its audit of every invariant of the chaos
# oracle); then `docker compose stop` (every service must exit 0 on SIGTERM) / `start` of the
# whole cluster, `down` (containers removed, volumes kept) / `up`, and `twopc audit` of the
# recorded run must pass again against the recreated containers. Every wait is bounded; the cluster, its
# network and its volumes are removed on exit, pass or fail. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

ORDERS=${TWOPC_TEST_ORDERS:-20000}
CONCURRENCY=${TWOPC_TEST_CONCURRENCY:-2}
PARTITION_SECONDS=${TWOPC_TEST_PARTITION_SECONDS:-5}
LOADGEN_TIMEOUT_SECONDS=${TWOPC_TEST_LOADGEN_TIMEOUT_SECONDS:-300}
HEALTHY_TIMEOUT_SECONDS=60

PROJECT="twopc-compose-test-$(date +%s)-$$"
WORK=$(mktemp -d)
export COMPOSE_PROJECT_NAME=$PROJECT
T0=$SECONDS
STEP_NAME=""
STEP_T0=0
TIMINGS=()

log() { printf '[compose-test %s +%3ds] %s\n' "$(date -u +%H:%M:%S)" "$((SECONDS - T0))" "$*"; }
fail() { log "FAIL: $*"; exit 1; }
step_end() {
    if [[ -n $STEP_NAME ]]; then
        TIMINGS+=("$(printf '%4ds  %s' "$((SECONDS - STEP_T0))" "$STEP_NAME")")
    fi
    STEP_NAME=""
}
step() {
    step_end
    STEP_NAME=$1
    STEP_T0=$SECONDS
    printf '\n'
    log "== $1"
}

# The machine's Docker daemon normally runs already; start it if it does not (as root).
if ! docker info >/dev/null 2>&1; then
    [[ $(id -u) -eq 0 ]] || fail "the Docker daemon is not reachable"
    log "the Docker daemon is not reachable; starting it"
    service docker start >/dev/null 2>&1 || true
    for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
    docker info >/dev/null 2>&1 || fail "the Docker daemon did not start"
fi
if ! docker compose version >/dev/null 2>&1 && ! command -v docker-compose >/dev/null; then
    [[ $(id -u) -eq 0 ]] || fail "neither 'docker compose' nor 'docker-compose' is installed"
    log "installing docker-compose (Debian package)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose >/dev/null
fi
if docker compose version >/dev/null 2>&1; then
    DC=(docker compose)
elif command -v docker-compose >/dev/null; then
    DC=(docker-compose)
else
    fail "neither 'docker compose' nor 'docker-compose' is installed"
fi
log "using: ${DC[*]} ($("${DC[@]}" version --short 2>/dev/null || true)), Docker Engine $(docker version -f '{{.Server.Version}}')"
dc() { "${DC[@]}" -p "$PROJECT" -f "$ROOT/docker-compose.yml" "$@"; }
# dc with a time bound: `dct SECONDS ARGS...`.
dct() { timeout "$1" "${DC[@]}" -p "$PROJECT" -f "$ROOT/docker-compose.yml" "${@:2}"; }

# Loopback ports the kernel says are free, so the test never collides with a running demo.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
export TWOPC_COORDINATOR_PORT TWOPC_INVENTORY_PORT TWOPC_PAYMENTS_PORT TWOPC_SHIPPING_PORT
TWOPC_COORDINATOR_PORT=$(free_port)
TWOPC_INVENTORY_PORT=$(free_port)
TWOPC_PAYMENTS_PORT=$(free_port)
TWOPC_SHIPPING_PORT=$(free_port)
export TWOPC_DEMO_ORDERS=$ORDERS TWOPC_DEMO_CONCURRENCY=$CONCURRENCY
# Plain logs: they end up in files and CI output, not on a terminal.
export NO_COLOR=1
COORDINATOR="http://127.0.0.1:$TWOPC_COORDINATOR_PORT"
SERVICES=(coordinator inventory payments shipping)

cleanup() {
    local rc=$?
    step_end
    set +e
    if [[ $rc -ne 0 ]]; then
        printf '\n'
        log "failed (exit $rc); the last log lines of every container:"
        dc logs --no-color --tail=40 2>&1 | sed 's/^/    /'
    fi
    log "tearing down: compose down -v (project $PROJECT)"
    dct 120 down -v --remove-orphans --timeout 5 >/dev/null 2>&1
    # Anything compose missed (a one-off container, a half-created network or volume).
    docker ps -aq --filter "label=com.docker.compose.project=$PROJECT" | xargs -r docker rm -f >/dev/null 2>&1
    docker network ls -q --filter "label=com.docker.compose.project=$PROJECT" | xargs -r docker network rm >/dev/null 2>&1
    docker volume ls -q --filter "label=com.docker.compose.project=$PROJECT" | xargs -r docker volume rm >/dev/null 2>&1
    rm -rf "$WORK"
    printf '\n'
    log "step timings:"
    local line
    for line in "${TIMINGS[@]}"; do printf '    %s\n' "$line"; done
    if [[ $rc -eq 0 ]]; then
        log "PASS in $((SECONDS - T0)) s"
    else
        log "FAIL after $((SECONDS - T0)) s"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The container of a compose service (not a one-off `run` container), running or not.
container_of() {
    docker ps -aq --filter "label=com.docker.compose.project=$PROJECT" \
        --filter "label=com.docker.compose.service=$1" \
        --filter "label=com.docker.compose.oneoff=False" | head -n1
}
state_of() {
    docker inspect -f '{{.State.Status}}{{if .State.Health}} {{.State.Health.Status}}{{end}}' "$(container_of "$1")"
}

wait_healthy() {
    local deadline=$((SECONDS + HEALTHY_TIMEOUT_SECONDS)) service
    for service in "$@"; do
        until [[ $(state_of "$service") == "running healthy" ]]; do
            ((SECONDS < deadline)) || fail "$service not healthy after ${HEALTHY_TIMEOUT_SECONDS}s (state: $(state_of "$service"))"
            sleep 0.5
        done
    done
    log "healthy: $*"
}

# The service's /readyz through its published port: faster than Docker's 2 s health interval,
# so the next fault comes while the workload still commits (the stock runs out after ~600 orders).
published_url() {
    case $1 in
        coordinator) echo "http://127.0.0.1:$TWOPC_COORDINATOR_PORT" ;;
        inventory) echo "http://127.0.0.1:$TWOPC_INVENTORY_PORT" ;;
        payments) echo "http://127.0.0.1:$TWOPC_PAYMENTS_PORT" ;;
        shipping) echo "http://127.0.0.1:$TWOPC_SHIPPING_PORT" ;;
        *) fail "no published port for $1" ;;
    esac
}
wait_ready() {
    local deadline=$((SECONDS + HEALTHY_TIMEOUT_SECONDS)) url
    url="$(published_url "$1")/readyz"
    until curl -fsS -o /dev/null -m 2 "$url" 2>/dev/null; do
        ((SECONDS < deadline)) || fail "$1 not ready after ${HEALTHY_TIMEOUT_SECONDS}s ($url)"
        sleep 0.1
    done
    log "ready: $1 ($url)"
}

loadgen_running() { [[ $(docker inspect -f '{{.State.Running}}' "$(container_of loadgen)") == true ]]; }
require_load() {
    loadgen_running || fail "the loadgen finished before '$1'; raise TWOPC_TEST_ORDERS so the faults hit a live workload"
}

# Transactions the coordinator has decided since its last start, from /metrics on the published
# port: "<total> <committed> <aborted>".
coordinator_counts() {
    curl -fsS -m 2 "$COORDINATOR/metrics" 2>/dev/null | awk '
        /^twopc_coordinator_transactions_total\{outcome="committed"\}/ {c = $NF}
        /^twopc_coordinator_transactions_total\{outcome="aborted"\}/ {a = $NF}
        END {print c + a, c + 0, a + 0}'
}
# Waits until the coordinator has decided `want` transactions since its last start.
wait_progress() {
    local want=$1 deadline=$((SECONDS + 60)) total committed aborted
    while :; do
        read -r total committed aborted < <(coordinator_counts)
        ((total >= want)) && break
        ((SECONDS < deadline)) || fail "the coordinator decided only $total transactions, expected $want"
        require_load "waiting for $want decided transactions"
        sleep 0.2
    done
    log "the coordinator has decided $total transactions since its last start ($committed committed, $aborted aborted)"
}

kill_and_restart() {
    local service=$1 id
    id=$(container_of "$service")
    require_load "killing $service"
    log "docker kill $service (SIGKILL)"
    docker kill "$id" >/dev/null
    sleep 1
    # `docker kill` counts as a manual stop: the restart policy leaves it down, the test starts it.
    [[ $(docker inspect -f '{{.State.Running}}' "$id") == false ]] || fail "$service still running after docker kill"
    log "$service is down (exit $(docker inspect -f '{{.State.ExitCode}}' "$id")); docker start $service"
    docker start "$id" >/dev/null
    wait_ready "$service"
}

# The coordinator's view of a participant across the private network.
coordinator_reaches() {
    docker exec "$(container_of coordinator)" curl -fsS -o /dev/null -m 2 "http://$1:8080/healthz" 2>/dev/null
}

step "offline image build (docker/build-offline.sh)"
if [[ ${TWOPC_SKIP_BUILD:-0} == 1 ]]; then
    log "TWOPC_SKIP_BUILD=1: using the existing image"
else
    timeout 900 docker/build-offline.sh
fi
docker image inspect twopc:latest >/dev/null || fail "no twopc:latest image"
log "images on this engine (nothing pulled: debian:bookworm-slim is the local debootstrap import):"
docker images --format '    {{.Repository}}:{{.Tag}}  {{.ID}}  {{.Size}}' | grep -E 'twopc|debian' || true

step "the image's seeds (written by its twopc demo --write-seeds at build time)"
docker run --rm --pull=never --entrypoint sh twopc:latest -c \
    'cd /usr/local/share/twopc/seeds && for f in inventory payments shipping; do printf "%s " "$f"; cat "$f.json" | tr -d "\n"; echo; done' \
    >"$WORK/seeds.txt" || fail "cannot read the seeds in the image"
python3 - "$WORK/seeds.txt" <<'PY' || fail "the image's seeds are missing or not JSON objects"
import json, sys
for line in open(sys.argv[1]):
    name, body = line.split(" ", 1)
    seed = json.loads(body)
    assert isinstance(seed, dict), name
    print(f"    {name}: {len(seed)} keys")
PY

step "cluster up (project $PROJECT)"
dct 120 up -d --no-build "${SERVICES[@]}"
wait_healthy "${SERVICES[@]}"
curl -fsS -m 2 "$COORDINATOR/healthz" >/dev/null || fail "coordinator /healthz not reachable on the published port"
curl -fsS -m 2 "$COORDINATOR/metrics" | grep -q '^twopc_coordinator_ready 1' \
    || fail "coordinator /metrics on the published port does not say ready"
log "coordinator API and /metrics published on $COORDINATOR"

step "authentication: token files from the tokens volume; 401 without, answers with"
# The set the `tokens` service wrote (once): copied out for this host's curl, readable by us only.
(umask 077 && dc run --rm --no-deps -T --entrypoint cat tokens /tokens/operator.tokens \
    >"$WORK/operator.tokens") || fail "cannot read operator.tokens from the tokens volume"
dc run --rm --no-deps -T --entrypoint sh tokens -c 'ls -ln /tokens' >"$WORK/tokens.ls" \
    || fail "cannot list the tokens volume"
sed 's/^/    tokens volume| /' "$WORK/tokens.ls"
awk 'NR > 1 && $1 != "-rw-------" {bad = 1} END {exit bad}' "$WORK/tokens.ls" \
    || fail "a token file is readable by others than its owner"
OPERATOR_TOKEN=$(awk '!/^#/ && NF {print $NF; exit}' "$WORK/operator.tokens")
[[ ${#OPERATOR_TOKEN} -ge 16 ]] || fail "no operator token in the tokens volume"
status=$(curl -s -o "$WORK/unauthorized.json" -w '%{http_code}' -m 5 "$COORDINATOR/v1/transactions")
[[ $status == 401 ]] && grep -q '"error":"unauthorized"' "$WORK/unauthorized.json" \
    || fail "GET /v1/transactions without a token answered $status: $(cat "$WORK/unauthorized.json")"
log "without a token: 401 unauthorized"
# The token goes in a header file, not onto a command line.
printf 'authorization: Bearer %s\n' "$OPERATOR_TOKEN" >"$WORK/auth.header"
chmod 600 "$WORK/auth.header"
status=$(curl -s -o /dev/null -w '%{http_code}' -m 5 -H @"$WORK/auth.header" "$COORDINATOR/v1/transactions")
[[ $status == 200 ]] || fail "GET /v1/transactions with the operator token answered $status"
log "with the operator token: 200"
dct 60 run --rm --no-deps -T loadgen ctl --coordinator=http://coordinator:8080 \
    --token-file=/tokens/operator.tokens list >"$WORK/ctl.out" 2>&1 \
    || fail "twopc ctl list with the operator token failed: $(cat "$WORK/ctl.out")"
log "twopc ctl list with --token-file from the volume: exit 0"

step "loadgen starts: $ORDERS checkout orders, $CONCURRENCY at a time"
dct 60 up -d --no-build --no-deps loadgen
wait_progress 50

step "docker kill the coordinator mid-load, start it again"
kill_and_restart coordinator
wait_progress 10

step "docker kill a participant (inventory) mid-load, start it again"
kill_and_restart inventory
read -r before _ < <(coordinator_counts)
wait_progress $((before + 10))

step "partition a participant (payments) for ${PARTITION_SECONDS}s, reconnect it"
require_load "the partition"
network=$(docker network ls -q --filter "label=com.docker.compose.project=$PROJECT" \
    --filter "label=com.docker.compose.network=twopc")
[[ -n $network ]] || fail "no compose network found for $PROJECT"
payments=$(container_of payments)
docker network disconnect "$network" "$payments"
log "payments disconnected"
! coordinator_reaches payments || fail "the coordinator still reaches payments across the partition"
log "the coordinator cannot reach payments"
sleep "$PARTITION_SECONDS"
docker network connect --alias payments "$network" "$payments"
log "payments reconnected"
deadline=$((SECONDS + 30))
until coordinator_reaches payments; do
    ((SECONDS < deadline)) || fail "the coordinator does not reach payments 30 s after reconnecting"
    sleep 0.5
done
log "the coordinator reaches payments again"
wait_healthy "${SERVICES[@]}"

step "loadgen finishes; its audit of every invariant must pass"
loadgen=$(container_of loadgen)
if ! exit_code=$(timeout "$LOADGEN_TIMEOUT_SECONDS" docker wait "$loadgen"); then
    fail "the loadgen did not finish within ${LOADGEN_TIMEOUT_SECONDS}s"
fi
docker logs "$loadgen" 2>&1 | tail -n 40 | sed 's/^/    loadgen| /'
[[ $exit_code == 0 ]] || fail "the loadgen exited $exit_code: an invariant does not hold or the run failed"
log "loadgen exited 0"

step "stop the whole cluster (graceful), start it again; then down and up: new containers, same volumes"
dct 120 stop --timeout 15 "${SERVICES[@]}"
for service in "${SERVICES[@]}"; do
    read -r running code < <(docker inspect -f '{{.State.Running}} {{.State.ExitCode}}' "$(container_of "$service")")
    [[ $running == false ]] || fail "$service still running after stop"
    # SIGTERM is a clean shutdown: exit 0 (docs/operations.md, exit codes).
    [[ $code == 0 ]] || fail "$service exited $code on SIGTERM, expected 0"
done
log "all four stopped cleanly (exit 0)"
dct 120 start "${SERVICES[@]}"
wait_healthy "${SERVICES[@]}"
dct 120 down --timeout 15
[[ -z $(docker ps -aq --filter "label=com.docker.compose.project=$PROJECT") ]] || fail "containers left after down"
log "all containers removed; volumes kept: $(docker volume ls -q --filter "label=com.docker.compose.project=$PROJECT" | wc -l)"
dct 120 up -d --no-build "${SERVICES[@]}"
wait_healthy "${SERVICES[@]}"

step "twopc audit of the recorded run against the recreated cluster"
audit_out="$WORK/audit.out"
audit_rc=0
dct 120 run --rm --no-deps -T loadgen \
    audit --record=/data/record.json \
    --target-coordinator=http://coordinator:8080 --target-inventory=http://inventory:8080 \
    --target-payments=http://payments:8080 --target-shipping=http://shipping:8080 \
    >"$audit_out" 2>&1 || audit_rc=$?
tail -n 30 "$audit_out" | sed 's/^/    audit| /'
[[ $audit_rc -eq 0 ]] || fail "twopc audit exited $audit_rc on the cluster recreated from its volumes"
log "audit passed: the volumes kept every outcome"
