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
#   4. with --ha (docker-compose.ha.yml, the coordinator group): two more images on the same
#              base, each holding one program from this machine's Debian packages:
#              twopc-etcd:latest (Debian's etcd-server: the host's /usr/bin/etcd, installed with
#              apt if missing) and twopc-haproxy:latest (Debian's haproxy and the three
#              libraries the minbase lacks, fetched with `apt-get download` into the cache and
#              unpacked, never installed on the host). See docker/Dockerfile.etcd-offline and
#              docker/Dockerfile.haproxy-offline.
#
# Environment:
#   TWOPC_IMAGE              image to build (default twopc:latest)
#   TWOPC_BINARY             use this already-built binary instead of running cargo
#   TWOPC_DOCKER_BASE_CACHE  where the rootfs tarball is cached (default target/docker-base)
#   TWOPC_DEBIAN_MIRROR      Debian mirror for debootstrap (default: the one apt uses here)
#   CARGO_TARGET_DIR         honoured for the cargo build (default target)
#   TWOPC_ETCD_BINARY        with --ha: the etcd binary to copy (default: `command -v etcd`)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

BASE_TAG=debian:bookworm-slim
BASE_LABEL=org.twopc.base
IMAGE=${TWOPC_IMAGE:-twopc:latest}
ETCD_IMAGE=twopc-etcd:latest
HAPROXY_IMAGE=twopc-haproxy:latest
# Debian bookworm's haproxy and the libraries it links that the minbase does not hold.
HAPROXY_DEBS=(haproxy liblua5.3-0 libopentracing-c-wrapper0 libopentracing1)
HA=0
for arg in "$@"; do
    case $arg in
        --ha) HA=1 ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "build-offline.sh: unknown argument $arg (only --ha)" >&2; exit 2 ;;
    esac
done
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

# Builds `$2` from docker/`$1` with the context directory `$3`, pulling nothing.
docker_build() {
    local dockerfile=$1 tag=$2 context=$3 logfile
    logfile="$CACHE/build-$(basename "$dockerfile").log"
    log "docker build $dockerfile (legacy builder, --pull=false) -> $tag"
    if ! DOCKER_BUILDKIT=0 docker build --pull=false \
        -f "$ROOT/docker/$dockerfile" -t "$tag" "$context" >"$logfile" 2>&1; then
        tail -n 30 "$logfile" >&2
        die "docker build $dockerfile failed (full log: $logfile)"
    fi
    log "built $tag ($(docker image inspect -f '{{.Size}}' "$tag" | awk '{printf "%.0f MB", $1/1e6}'))"
}

# etcd as Debian ships it: the host's binary (bookworm, like the base, so its one dynamic
# dependency, glibc, matches) and etcdctl for operators.
build_etcd_image() {
    local etcd=${TWOPC_ETCD_BINARY:-$(command -v etcd || true)}
    if [[ -z $etcd ]]; then
        [[ $(id -u) -eq 0 ]] || die "etcd is not installed (Debian: etcd-server) and installing it needs root"
        log "installing etcd-server and etcd-client (Debian packages) for their binaries"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends etcd-server etcd-client >/dev/null
        # The package enables a system etcd; only the binary is wanted.
        if command -v systemctl >/dev/null 2>&1; then systemctl stop etcd >/dev/null 2>&1 || true; fi
        etcd=$(command -v etcd)
    fi
    [[ -x $etcd ]] || die "$etcd is not an executable"
    local context="$CACHE/context-etcd"
    rm -rf "$context"
    mkdir -p "$context"
    cp "$etcd" "$context/etcd"
    local etcdctl
    etcdctl=$(command -v etcdctl || true)
    if [[ -n $etcdctl ]]; then cp "$etcdctl" "$context/etcdctl"; else touch "$context/etcdctl"; fi
    docker_build Dockerfile.etcd-offline "$ETCD_IMAGE" "$context"
    rm -rf "$context"
}

# haproxy from Debian's packages, unpacked (dpkg-deb -x) rather than installed: the image gets
# the binary and its libraries, none of the package's service scripts.
build_haproxy_image() {
    local debs="$CACHE/haproxy-debs" context="$CACHE/context-haproxy"
    mkdir -p "$debs"
    if ! ls "$debs"/haproxy_*.deb >/dev/null 2>&1; then
        log "apt-get download ${HAPROXY_DEBS[*]}"
        # _apt cannot write into a root-owned cache: download as the caller, unsandboxed.
        (cd "$debs" && apt-get -o APT::Sandbox::User=root download "${HAPROXY_DEBS[@]}" >/dev/null) \
            || die "apt-get download ${HAPROXY_DEBS[*]} failed"
    fi
    rm -rf "$context"
    mkdir -p "$context/unpacked" "$context/rootfs/usr/sbin" "$context/rootfs/usr/lib" "$context/rootfs/etc"
    local deb
    for deb in "$debs"/*.deb; do dpkg-deb -x "$deb" "$context/unpacked"; done
    # Only the binary, the libraries and the error pages, all under usr/ and etc/: the base is
    # merged-/usr, and a lib/ or bin/ directory in the copy would replace its symlinks.
    cp -a "$context/unpacked/usr/sbin/haproxy" "$context/rootfs/usr/sbin/"
    cp -a "$context/unpacked/usr/lib/x86_64-linux-gnu" "$context/rootfs/usr/lib/"
    cp -a "$context/unpacked/etc/haproxy" "$context/rootfs/etc/"
    rm -rf "$context/unpacked"
    docker_build Dockerfile.haproxy-offline "$HAPROXY_IMAGE" "$context"
    rm -rf "$context"
}

main() {
    command -v docker >/dev/null || die "docker is not installed"
    docker info >/dev/null 2>&1 || die "the docker daemon is not reachable"
    local started=$SECONDS
    ensure_base
    local binary
    binary=$(host_binary)
    build_image "$binary"
    if [[ $HA == 1 ]]; then
        build_etcd_image
        build_haproxy_image
        # The images these builds replaced, if any.
        docker image prune -f --filter "label=org.twopc.image=offline-etcd" >/dev/null
        docker image prune -f --filter "label=org.twopc.image=offline-haproxy" >/dev/null
    fi
    log "done in $((SECONDS - started)) s"
}

main "$@"
