#!/usr/bin/env bash
# kvslim against llama.cpp built from source for this CPU (llama-bench), on the very same GGUF
# files, in one run: prefill (pp) and decode (tg) tok/s and their same-run ratios.
#
#   bench/native_bench.sh [BUILD_DIR]          (default BUILD_DIR: <repo>/build)
#
# Rows as llama-bench's: pp (a prompt of N_PROMPT tokens into an empty cache) and tg (N_GEN
# tokens decoded one at a time from depth 0; kvslim's after a 1-token prompt).
# For each weight type the synthetic 85.7M llama (bench/lib.sh's BENCH_SHAPE) is written once
# with `kvslim bench --synthetic ...,type=T --save` (Q4_K_M and Q5_K_M mix Q4_K / Q5_K with Q6_K
# per tensor as llama.cpp's rules do). Then, for each thread count and round, kvslim
# (`kvslim bench`, F16 KV cache) and llama-bench (`-p N_PROMPT -n N_GEN
# -r 1`, its defaults: F16 KV cache, its warm-up run) time that file one after the other, the
# order alternating from round to round. The table gives medians over the rounds; each ratio
# is the median of the per-round ratios kvslim / llama.cpp (> 1: kvslim faster).
#
# The peer: LLAMA_BENCH=path/to/llama-bench, or PEER_DIR/build/bin/llama-bench (PEER_DIR
# default: ../peer-llamacpp beside the repository), built when missing from LLAMACPP_GIT (the
# bare git directory of a fetched snapshot of github:ngxson/llama.cpp) with
# ../shared/peers/build-llamacpp.sh (CPU-only Release, GGML_NATIVE=ON; about 6 minutes).
#
# Environment: PEER_COMMIT (reported; default: LLAMACPP_GIT's HEAD), TYPES ("q4_k_m q6_k"), THREADS ("1 2"), ROUNDS (3), N_PROMPT (512), N_GEN (128),
#   EXACT=1 (also time kvslim --exact-matmul), NO_BUILD=1 (don't rebuild kvslim).
# Output: a markdown table on stdout, progress on stderr, BUILD_DIR/bench/native.json (raw
# per-run JSON in BUILD_DIR/bench/native-raw/, models in BUILD_DIR/bench/models/).
# A benchmark, not a test: it takes minutes and must not run in tests or CI.
set -euo pipefail

if [ -n "${CI:-}" ]; then
    echo "native_bench.sh: not run in CI (benchmark)" >&2
    exit 0
fi
REPO=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$REPO/build}
. "$REPO/bench/lib.sh"
TYPES=${TYPES:-"q4_k_m q6_k"}
THREADS=${THREADS:-"1 2"}
ROUNDS=${ROUNDS:-3}
N_PROMPT=${N_PROMPT:-512}
N_GEN=${N_GEN:-128}
OUT=$BUILD/bench
RAW=$OUT/native-raw
mkdir -p "$OUT/models" "$RAW"
rm -f "$RAW"/*.json
log() { echo "$*" >&2; }

[ -n "${NO_BUILD:-}" ] || make -C "$REPO" build >/dev/null
KVSLIM=$BUILD/kvslim
[ -x "$KVSLIM" ] || { log "native_bench.sh: $KVSLIM not built"; exit 1; }

PEER_DIR=${PEER_DIR:-$REPO/../peer-llamacpp}
LLAMA_BENCH=${LLAMA_BENCH:-$PEER_DIR/build/bin/llama-bench}
if [ ! -x "$LLAMA_BENCH" ]; then
    [ -n "${LLAMACPP_GIT:-}" ] || { log "native_bench.sh: no llama-bench at $LLAMA_BENCH; set LLAMA_BENCH, or LLAMACPP_GIT to a fetched snapshot of github:ngxson/llama.cpp to build it"; exit 1; }
    log "== building llama-bench in $PEER_DIR (about 6 minutes)"
    LLAMA_BENCH=$(bash "$REPO/../shared/peers/build-llamacpp.sh" "$LLAMACPP_GIT" "$PEER_DIR")
fi
# The snapshot's commit (llama-bench built from an extracted tree reports "unknown").
PEER_COMMIT=${PEER_COMMIT:-$( { [ -n "${LLAMACPP_GIT:-}" ] && git -C "$LLAMACPP_GIT" rev-parse HEAD; } || echo unknown)}

engines=(kvslim llama)
[ -z "${EXACT:-}" ] || engines=(kvslim kvslim-exact llama)

run_one() { # engine type model threads round -> raw json
    local engine=$1 type=$2 model=$3 t=$4 r=$5
    local json=$RAW/${engine}__${type}__t${t}__r${r}.json
    case $engine in
    kvslim | kvslim-exact)
        local exact=(); [ "$engine" = kvslim ] || exact=(--exact-matmul)
        # pp from an empty cache; tg after a 1-token prompt (llama-bench's tg starts at depth 0)
        "$KVSLIM" bench -m "$model" -p "$N_PROMPT" -n 0 -t "$t" "${exact[@]}" --json "$json.pp" >/dev/null &&
        "$KVSLIM" bench -m "$model" -p 1 -n "$N_GEN" -t "$t" "${exact[@]}" --json "$json.tg" >/dev/null &&
        python3 -c 'import json,sys; pp=json.load(open(sys.argv[1])); tg=json.load(open(sys.argv[2])); json.dump({"prefill_tok_s": pp["prefill_tok_s"], "decode_tok_s": tg["decode_tok_s"]}, open(sys.argv[3], "w"))' \
            "$json.pp" "$json.tg" "$json" && rm -f "$json.pp" "$json.tg" ;;
    llama) "$LLAMA_BENCH" -m "$model" -p "$N_PROMPT" -n "$N_GEN" -t "$t" -r 1 -o json >"$json" 2>/dev/null ;;
    esac || { log "native_bench.sh: $engine failed ($type, t=$t, round $r)"; rm -f "$json"; }
}

for type in $TYPES; do
    model=$(bench_synthetic "$KVSLIM" "$OUT/models" "$BENCH_SHAPE" 4096 "$type" 2)
    for t in $THREADS; do
        for r in $(seq 1 "$ROUNDS"); do
            order=("${engines[@]}")
            [ $((r % 2)) -eq 0 ] && order=($(printf '%s\n' "${engines[@]}" | tac))
            for e in "${order[@]}"; do
                log "== $type t=$t round $r: $e"
                run_one "$e" "$type" "$model" "$t" "$r"
            done
        done
    done
done

python3 - "$RAW" "$OUT/native.json" "$PEER_COMMIT" "$LLAMA_BENCH" "$N_PROMPT" "$N_GEN" <<'PY'
import glob, json, os, statistics, sys
raw, out, commit, peer, n_prompt, n_gen = sys.argv[1:7]
runs = {}
for path in glob.glob(os.path.join(raw, '*.json')):
    engine, typ, t, r = os.path.basename(path)[:-5].split('__')
    try:
        data = json.load(open(path))
    except ValueError:
        continue
    if engine.startswith('kvslim'):
        pp, tg = data['prefill_tok_s'], data['decode_tok_s']
    else:
        pp = next(x['avg_ts'] for x in data if x['n_prompt'] > 0 and x['n_gen'] == 0)
        tg = next(x['avg_ts'] for x in data if x['n_gen'] > 0 and x['n_prompt'] == 0)
        if data[0].get('build_commit', 'unknown') != 'unknown':
            commit = data[0]['build_commit']
    runs[(engine, typ, int(t[1:]), int(r[1:]))] = (pp, tg)
engines = sorted({k[0] for k in runs}, key=lambda e: (e == 'llama', e))
rows = []
print(f'| type | threads | row | ' + ' | '.join(f'{e} tok/s' for e in engines) +
      ' | ' + ' | '.join(f'{e} / llama.cpp' for e in engines if e != 'llama') + ' |')
print('|---' * (3 + 2 * len(engines) - 1) + '|')
for typ, t in sorted({(k[1], k[2]) for k in runs}):
    for i, row in enumerate((f'pp{n_prompt}', f'tg{n_gen}')):
        rounds = sorted({k[3] for k in runs if k[1] == typ and k[2] == t})
        med = {e: statistics.median([runs[(e, typ, t, r)][i] for r in rounds if (e, typ, t, r) in runs] or [0])
               for e in engines}
        ratio = {}
        for e in engines:
            if e == 'llama':
                continue
            rs = [runs[(e, typ, t, r)][i] / runs[('llama', typ, t, r)][i] for r in rounds
                  if (e, typ, t, r) in runs and ('llama', typ, t, r) in runs and runs[('llama', typ, t, r)][i] > 0]
            ratio[e] = statistics.median(rs) if rs else 0
        rows.append({'type': typ, 'threads': t, 'row': row, 'tok_s': med, 'ratio': ratio, 'rounds': len(rounds)})
        print(f'| {typ} | {t} | {row} | ' + ' | '.join(f'{med[e]:.1f}' for e in engines) + ' | ' +
              ' | '.join(f'{ratio[e]:.2f}x' for e in engines if e != 'llama') + ' |')
cpu = next((l.split(':', 1)[1].strip() for l in open('/proc/cpuinfo') if l.startswith('model name')), '?')
print(f'\nllama.cpp: {peer} (build commit {commit}); CPU: {cpu}; medians of {max(r["rounds"] for r in rows) if rows else 0} rounds')
json.dump({'peer': peer, 'peer_commit': commit, 'cpu': cpu, 'rows': rows}, open(out, 'w'), indent=1)
PY
