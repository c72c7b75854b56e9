#!/usr/bin/env bash
# make fuzz: builds the libFuzzer harnesses of fuzz/ with clang (build-fuzz, -DKVS_FUZZ=ON) and
# runs each for FUZZ_SECONDS on a working copy of its seed corpus (fuzz/corpus is never
# written). A crash, leak, timeout or out-of-memory fails the run; the input that caused it is
# left in build-fuzz/artifacts/ and its path printed.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${FUZZ_BUILD:-build-fuzz}
SECONDS_EACH=${FUZZ_SECONDS:-10}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}
export KVS_SHARED_DIR=${KVS_SHARED_DIR:-$(cd .. && pwd)/shared}

bash scripts/setup-deps.sh clang || exit 1
CC=clang bash scripts/quiet.sh configure "$BUILD/build.log" \
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Debug -DKVS_FUZZ=ON || exit 1
bash scripts/quiet.sh build "$BUILD/build.log" \
  cmake --build "$BUILD" -j "$JOBS" --target fuzzers || exit 1

# Per harness: the largest input worth trying and any extra flags.
# fuzz_mpc_msg stays well under a socket buffer (the harness queues the peer's bytes at once).
declare -A max_len=([fuzz_gguf]=65536 [fuzz_kv_spec]=512 [fuzz_tokenize]=4096
  [fuzz_llama2c]=32768 [fuzz_tokens]=4096 [fuzz_server_request]=8192 [fuzz_mpc_msg]=16384)
declare -A extra=([fuzz_gguf]="-dict=fuzz/gguf.dict")

# Seeds read from ../shared at run time (never copied into the repository): llama.cpp's
# vocabulary test inputs for the tokenizers, the first 8 KiB of two vocabulary GGUFs (real
# headers and metadata, cut off) for the GGUF reader, llama2.c's 512-token tokenizer.bin after
# a tiny checkpoint of that vocabulary (the seed vocab512-no-tokenizer.bin) for the llama2.c
# importer, and a golden token file for the token-file parser.
shared_seeds() {
  local h=$1 work=$2 vocab=$KVS_SHARED_DIR/models/vocab
  case $h in
  fuzz_llama2c)
    cat fuzz/corpus/fuzz_llama2c/vocab512-no-tokenizer.bin "$KVS_SHARED_DIR/models/tok512.bin" \
      >"$work/shared-tok512.bin" ;;
  fuzz_tokens)
    cp -f "$KVS_SHARED_DIR/models/golden/stories260K-sample-512.tokens" "$work/shared-golden.tokens" ;;
  fuzz_tokenize) cp -f "$vocab/ggml-vocab-gpt-2.gguf.inp" "$work/shared-vocab-tests.txt" ;;
  fuzz_gguf)
    for v in gpt-2 llama-spm; do
      head -c 8192 "$vocab/ggml-vocab-$v.gguf" >"$work/shared-vocab-$v-head8k.gguf"
    done ;;
  esac
}

# One harness: seeds into its working corpus, then libFuzzer for SECONDS_EACH; the exit status
# goes to $BUILD/<harness>.rc.
run_one() {
  local h=$1 work="$BUILD/corpus/$1" log="$BUILD/$1.log"
  mkdir -p "$work"
  # The seeds are copied in; inputs found by earlier runs stay, so coverage builds up.
  cp -f fuzz/corpus/"$h"/* "$work"/
  shared_seeds "$h" "$work"
  # shellcheck disable=SC2086
  "$BUILD/$h" -max_total_time="$SECONDS_EACH" -max_len="${max_len[$h]:-4096}" -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$BUILD/artifacts/$h-" \
    ${extra[$h]:-} "$work" >"$log" 2>&1
  echo $? >"$BUILD/$h.rc"
}

# FUZZ_JOBS harnesses at a time (default: one per core), so CI's step takes
# 7 x FUZZ_SECONDS / FUZZ_JOBS.
PARALLEL=${FUZZ_JOBS:-$JOBS}
harnesses=()
for src in fuzz/fuzz_*.c; do harnesses+=("$(basename "$src" .c)"); done
mkdir -p "$BUILD/artifacts"
echo "fuzz: ${#harnesses[@]} harnesses, ${SECONDS_EACH}s each, $PARALLEL at a time"
running=0
for h in "${harnesses[@]}"; do
  if [ "$running" -ge "$PARALLEL" ]; then
    wait -n
    running=$((running - 1))
  fi
  rm -f "$BUILD/$h.rc"
  run_one "$h" &
  running=$((running + 1))
done
wait

failed=()
for h in "${harnesses[@]}"; do
  log="$BUILD/$h.log"
  rc=$(cat "$BUILD/$h.rc" 2>/dev/null || echo 1)
  echo "fuzz: $h (log: $log)"
  { grep -E '^#[0-9]+.*cov:' "$log" | tail -n 1
    grep -E 'stat::number_of_executed_units|stat::average_exec_per_sec' "$log"; } |
    sed 's/^/  /'
  if [ "$rc" -ne 0 ]; then
    tail -n 40 "$log"
    art=$(grep -oE "Test unit written to [^ ]+" "$log" | sed 's/Test unit written to //')
    echo "fuzz: $h FAILED (exit $rc); input: ${art:-see $log}" >&2
    # A CI machine is thrown away: the input goes to the log too, to be kept in
    # fuzz/regress/<harness>/ (base64 -d), where the replay ctest runs it from then on.
    if [ -n "$art" ] && [ -f "$art" ] && [ "$(stat -c %s "$art")" -le 65536 ]; then
      echo "fuzz: $h input, base64:" >&2
      base64 -w 100 "$art" >&2
    fi
    failed+=("$h")
  fi
done
if [ ${#failed[@]} -ne 0 ]; then
  echo "fuzz: failures in ${failed[*]}" >&2
  exit 1
fi
echo "fuzz: no crashes"
