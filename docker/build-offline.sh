#!/usr/bin/env bash
# Builds the `twopc:latest` image without pulling anything from a registry (design section 9).
#
#   1. base:   a Debian bookworm minbase root filesystem made by debootstrap from the Debian mirror
#              this machine's apt already uses, with curl for the health checks, cached as a
#              tarball under target/docker-base/, then `docker import`ed as debian:bookworm-slim,
#              the tag docker/Dockerfile's runtime stage names; so one docker-compose.yml serves
#              users with a registry and machines without one.
#   2. binary: `cargo build --release --bin twopc` on the host (same glibc as the base).
#   3. image:  docker/Dockerfile.offline copies that binary and the seeds it writes
#              (`twopc demo --write-seeds`) onto the base, with the legacy builder and
#              --pull=false: nothing is fetched.
#
# Environment:
#   TWOPC_IMAGE              image to build (default twopc:latest)
#   TWOPC_BINARY             use this already-built binary instead of running cargo
#   TWOPC_DOCKER_BASE_CACHE  where the rootfs tarball is cached (default target/docker-base)
#   TWOPC_DEBIAN_MIRROR      Debian mirror for debootstrap (default: the one apt uses here)
#   CARGO_TARGET_DIR         honoured for the cargo build (default target)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

BASE_TAG=debian:bookworm-slim
BASE_LABEL=org.twopc.base
IMAGE=${TWOPC_IMAGE:-twopc:latest}
CACHE=${TWOPC_DOCKER_BASE_CACHE:-$ROOT/target/docker-base}
# Bump when the rootfs recipe changes, so a stale cached tarball is rebuilt.
RECIPE="bookworm minbase include=curl,ca-certificates v1"
INCLUDE=curl,ca-certificates

log() { printf '[build-offline %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# The first Debian (not security) mirror in apt's sources, so debootstrap goes where apt goes.
debian_mirror() {
    if [[ -n ${TWOPC_DEBIAN_MIRROR:-} ]]; then
        echo "$TWOPC_DEBIAN_MIRROR"
        return
    fi
    local uri
    uri=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null \
        | awk '/^URIs:/ {for (i = 2; i <= NF; i++) print $i}' \
        | grep -v -e security -e '^cdrom' | head -n1 || true)
    if [[ -z $uri ]]; then
        uri=$(grep -hE '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
            | awk '{for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) {print $i; exit}}' \
            | grep -v security | head -n1 || true)
    fi
    echo "${uri:-http://deb.debian.org/debian}"
}

make_rootfs_tarball() {
    local tarball=$1 rootfs="$CACHE/rootfs"
    if ! command -v debootstrap >/dev/null; then
        log "installing debootstrap"
        [[ $(id -u) -eq 0 ]] || die "debootstrap is missing and installing it needs root"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
    fi
    [[ $(id -u) -eq 0 ]] || die "debootstrap needs root"
    local mirror
    mirror=$(debian_mirror)
    log "debootstrap --variant=minbase --include=$INCLUDE bookworm from $mirror"
    rm -rf "$rootfs"
    mkdir -p "$rootfs"
    if ! debootstrap --variant=minbase --include="$INCLUDE" bookworm "$rootfs" "$mirror" \
        >"$CACHE/debootstrap.log" 2>&1; then
        tail -n 30 "$CACHE/debootstrap.log" >&2
        die "debootstrap failed (full log: $CACHE/debootstrap.log)"
    fi
    # What a slim image leaves out: package lists and downloaded .debs.
    rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/archives/*.deb \
        "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/log/*.log
    tar --numeric-owner -C "$rootfs" -cf "$tarball.tmp" .
    mv "$tarball.tmp" "$tarball"
    echo "$RECIPE" >"$CACHE/recipe"
    rm -rf "$rootfs"
    log "rootfs cached: $tarball ($(du -h "$tarball" | cut -f1))"
}

ensure_base() {
    local have
    have=$(docker image inspect -f "{{ index .Config.Labels \"$BASE_LABEL\" }}" "$BASE_TAG" 2>/dev/null || true)
    if [[ $have == "$RECIPE" ]]; then
        log "base image $BASE_TAG already imported ($RECIPE)"
        return
    fi
    if docker image inspect "$BASE_TAG" >/dev/null 2>&1; then
        log "note: $BASE_TAG exists but was not made by this script; re-tagging it to the local base"
    fi
    mkdir -p "$CACHE"
    local tarball="$CACHE/bookworm-minbase.tar"
    if [[ -f $tarball && $(cat "$CACHE/recipe" 2>/dev/null) == "$RECIPE" ]]; then
        log "using cached rootfs $tarball"
    else
        make_rootfs_tarball "$tarball"
    fi
    log "docker import -> $BASE_TAG"
    docker import \
        --change "LABEL $BASE_LABEL=\"$RECIPE\"" \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["bash"]' \
        "$tarball" "$BASE_TAG" >/dev/null
}

host_binary() {
    if [[ -n ${TWOPC_BINARY:-} ]]; then
        [[ -x $TWOPC_BINARY ]] || die "TWOPC_BINARY=$TWOPC_BINARY is not an executable"
        echo "$TWOPC_BINARY"
        return
    fi
    local target_dir=${CARGO_TARGET_DIR:-$ROOT/target}
    log "cargo build --release --bin twopc (target dir $target_dir)"
    cargo build --release --bin twopc >&2
    echo "$target_dir/release/twopc"
}

build_image() {
    local binary=$1 context="$CACHE/context"
    rm -rf "$context"
    mkdir -p "$context"
    cp "$binary" "$context/twopc"
    # The participants' seeds come from the binary itself, so they always match the checkout
    # workload that `twopc demo` drives and audits.
    "$binary" demo --write-seeds "$context/seeds" >/dev/null
    log "docker build (legacy builder, --pull=false) -> $IMAGE"
    if ! DOCKER_BUILDKIT=0 docker build --pull=false \
        -f "$ROOT/docker/Dockerfile.offline" -t "$IMAGE" "$context" >"$CACHE/build.log" 2>&1; then
        tail -n 30 "$CACHE/build.log" >&2
        die "docker build failed (full log: $CACHE/build.log)"
    fi
    rm -rf "$context"
    # The image this build replaced, if any, is now an untagged leftover: drop it.
    docker image prune -f --filter "label=org.twopc.image=offline" >/dev/null
    log "built $IMAGE ($(docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MB", $1/1e6}'))"
}

main() {
    command -v docker >/dev/null || die "docker is not installed"
    docker info >/dev/null 2>&1 || die "the docker daemon is not reachable"
    local started=$SECONDS
    ensure_base
    local binary
    binary=$(host_binary)
    build_image "$binary"
    log "done in $((SECONDS - started)) s"
}

main "$@"
