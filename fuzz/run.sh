#!/usr/bin/env bash
# Builds every fuzz target once and runs each for FUZZ_SECONDS (default 60), FUZZ_JOBS at a
# time (default 2). Exits non-zero if any target crashed, printing the crash input's path and
# how to reproduce it. See docs/fuzzing.md.
#
# Stable Rust is enough: with `--sanitizer none` cargo-fuzz passes only stable flags (the
# sanitizer coverage passes through -Cpasses and -Cllvm-args); no RUSTC_BOOTSTRAP, no nightly.
set -euo pipefail
cd "$(dirname "$0")"

CARGO_FUZZ_VERSION=0.13.2
FUZZ_SECONDS="${FUZZ_SECONDS:-60}"
FUZZ_JOBS="${FUZZ_JOBS:-2}"
# Overflow checks on: an arithmetic overflow an input can cause is a bug to find.
BUILD_FLAGS=(--sanitizer none --debug-assertions)
export CARGO_TARGET_DIR="$PWD/target"

stamp() { date -u +%H:%M:%S; }

if ! cargo fuzz --version 2>/dev/null | grep -qx "cargo-fuzz $CARGO_FUZZ_VERSION"; then
    echo "fuzz: installing cargo-fuzz $CARGO_FUZZ_VERSION ($(stamp))"
    cargo install cargo-fuzz --locked --version "$CARGO_FUZZ_VERSION"
fi

targets=()
while IFS= read -r target; do targets+=("$target"); done < <(cargo fuzz list)
if [ -n "${FUZZ_TARGETS:-}" ]; then read -r -a targets <<<"$FUZZ_TARGETS"; fi

echo "fuzz: building ${targets[*]} ($(stamp))"
build_start=$SECONDS
cargo fuzz build "${BUILD_FLAGS[@]}"
echo "fuzz: built in $((SECONDS - build_start)) s ($(stamp))"

triple="$(rustc -vV | sed -n 's/^host: //p')"
bin_dir="$CARGO_TARGET_DIR/$triple/release"
logs="$CARGO_TARGET_DIR/fuzz-logs"
mkdir -p "$logs"

# One target: the checked-in seeds are read, never written; what the run discovers goes to a
# working corpus under target/ (kept between local runs, absent on a fresh clone).
run_one() {
    local target="$1"
    local work="$CARGO_TARGET_DIR/fuzz-corpus/$target"
    local artifacts="$PWD/artifacts/$target/"
    mkdir -p "$work" "$artifacts" "corpus/$target"
    local status=0
    # The harnesses' servers keep their files here (on a memory file system where there is
    # one); removed after the run, since a fuzzing process never cleans up after itself.
    local scratch
    scratch="$(mktemp -d "$( [ -d /dev/shm ] && echo /dev/shm || echo "${TMPDIR:-/tmp}")/twopc-fuzz-$target.XXXXXX")"
    TWOPC_FUZZ_SCRATCH="$scratch" "$bin_dir/$target" "$work" "corpus/$target" \
        -max_total_time="$FUZZ_SECONDS" -timeout=60 -rss_limit_mb=4096 \
        -artifact_prefix="$artifacts" -print_final_stats=1 \
        >"$logs/$target.log" 2>&1 || status=$?
    rm -rf "$scratch"
    echo "$status" >"$logs/$target.status"
}

run_start=$SECONDS
for target in "${targets[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$FUZZ_JOBS" ]; do wait -n || true; done
    echo "fuzz: $target for ${FUZZ_SECONDS} s ($(stamp))"
    rm -f "$logs/$target.status"
    run_one "$target" &
done
wait

failed=0
for target in "${targets[@]}"; do
    status="$(cat "$logs/$target.status" 2>/dev/null || echo "no status")"
    execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$logs/$target.log" | tail -n 1)"
    rate="$(sed -n 's/^stat::average_exec_per_sec: *//p' "$logs/$target.log" | tail -n 1)"
    cov="$(grep -o 'cov: [0-9]*' "$logs/$target.log" | tail -n 1 || true)"
    if [ "$status" = 0 ]; then
        echo "fuzz: $target ok: ${execs:-?} runs, ${rate:-?} execs/s, ${cov:-cov: ?}"
    else
        failed=1
        echo "fuzz: $target FAILED (exit $status); last lines of $logs/$target.log:"
        tail -n 40 "$logs/$target.log" | sed 's/^/    /'
        for crash in $(grep -o "Test unit written to [^ ]*" "$logs/$target.log" | sed 's/Test unit written to //'); do
            echo "fuzz: crash input: $crash"
            echo "fuzz: reproduce: $bin_dir/$target $crash"
        done
    fi
done
echo "fuzz: runs took $((SECONDS - run_start)) s ($(stamp))"
exit "$failed"
