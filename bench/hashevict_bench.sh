#!/usr/bin/env bash
# HashEvict decode speed at long context against the full cache, h2o, tova and streaming, and the
# per-step cost of HashEvict's own work (hashing, victim search, eviction), on the synthetic
# 85.7M llama shape (dim 768, hidden 2048, 12 layers, 12 heads, 12 KV heads, vocab 512).
#
#   bench/hashevict_bench.sh [BUILD_DIR]        (default BUILD_DIR: <repo>/build; must be built)
#
# Every policy runs `kvslim bench -m MODEL -p N_PROMPT -n N_GEN -t THREADS --kv SPEC` ROUNDS
# times, rounds alternating over the policies; the table shows medians. HashEvict runs twice:
#   hashevict:budget=F,prefill=recent   the authors' prompt path (dense prefill, keep sinks +
#                                       newest); its decode is the same as the paper path's;
#   hashevict:budget=F                  the paper path (prompt beyond the budget fed token by
#                                       token through the eviction): slow prefill, one round
#                                       only (PAPER=0 skips it).
# HashEvict's per-step costs come from the policy's own CLOCK_MONOTONIC timers, which `kvslim
# bench` reads through the API (kvs_hashevict_timing_line in src/policies/hashevict.h; the
# policy itself prints nothing) and prints on stderr, one line per phase: microseconds per
# decode step (all layers and heads) for hashing the new keys and queries, the victim search,
# and the eviction (finding the victim's store row and moving the store's last row into it,
# kvs_store_remove_unordered, and writing the slot table); fed prompt tokens are reported
# separately. A bench that does not print those lines yet leaves the per-step table empty.
#
# Environment: N_PROMPT (8192), N_GEN (64), THREADS (2), BUDGET (0.1; a fraction, or N for slots=N), ROUNDS (3), PAPER (1),
#   POLICIES ("full streaming h2o tova"), QUIET_WAIT (60: before each run, wait up to this many
#   seconds for other processes to use < 0.15 cores; the load others put on the machine during
#   each run is reported as "foreign load").
# Output: a markdown table on stdout, progress on stderr; raw JSON, logs and results.json in
# BUILD_DIR/bench/hashevict/raw-p<N_PROMPT>-n<N_GEN>-t<THREADS>-b<BUDGET>/ (cleared first).
# A benchmark, not a test: it takes minutes.
set -euo pipefail

if [ -n "${CI:-}" ]; then
    echo "hashevict_bench.sh: not run in CI (benchmark)" >&2
    exit 0
fi

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=$(cd "${1:-$REPO/build}" && pwd)
KVSLIM=$BUILD_DIR/kvslim
[ -x "$KVSLIM" ] || { echo "hashevict_bench.sh: $KVSLIM not found (build first)" >&2; exit 1; }
N_PROMPT=${N_PROMPT:-8192} N_GEN=${N_GEN:-64} THREADS=${THREADS:-2} BUDGET=${BUDGET:-0.1}
ROUNDS=${ROUNDS:-3} PAPER=${PAPER:-1} QUIET_WAIT=${QUIET_WAIT:-60}
POLICIES=${POLICIES:-full streaming h2o tova}
OUT=$BUILD_DIR/bench/hashevict
RAW=$OUT/raw-p$N_PROMPT-n$N_GEN-t$THREADS-b$BUDGET
rm -rf "$RAW"
mkdir -p "$RAW"
CTX=$((N_PROMPT + N_GEN + 192))
MODEL=$OUT/synthetic-f32-ctx$CTX.gguf
SHAPE=dim=768,hidden=2048,layers=12,heads=12,kv_heads=12,vocab=512,ctx=$CTX
log() { echo "$*" >&2; }

if [ ! -f "$MODEL" ]; then
    log "writing $MODEL"
    "$KVSLIM" bench --synthetic "$SHAPE" --save "$MODEL" -p 16 -n 0 -t "$THREADS" >/dev/null
fi

busy_ticks() { local c; read -r -a c </proc/stat; echo $((c[1] + c[2] + c[3] + c[6] + c[7] + c[8])); }
busy_cores_1s() { # CPU use of the whole machine over one second, in cores x 100
    local a b
    a=$(busy_ticks); sleep 1; b=$(busy_ticks)
    echo $(((b - a) * 100 / $(getconf CLK_TCK)))
}
wait_quiet() {
    local waited=0 busy
    while busy=$(busy_cores_1s) && [ "$busy" -ge 15 ] && [ "$waited" -lt "$QUIET_WAIT" ]; do
        [ "$waited" -eq 0 ] && log "   machine busy (${busy}% of a core): waiting up to ${QUIET_WAIT}s"
        waited=$((waited + 1))
    done
}
own_ticks() { # CPU ticks of the script's waited-for children (cutime + cstime)
    local st; read -r st </proc/$$/stat; set -- ${st##*) }; echo $((${14} + ${15}))
}

run_one() { # spec tag round
    local spec=$1 tag=$2 r=$3 b0 o0 t0 b1 o1 t1
    local json=$RAW/${tag}__r$r.json err=$RAW/${tag}__r$r.log
    wait_quiet
    log "  round $r: $spec"
    b0=$(busy_ticks); o0=$(own_ticks); t0=$(date +%s%N)
    "$KVSLIM" bench -m "$MODEL" -p "$N_PROMPT" -n "$N_GEN" -t "$THREADS" --kv-type f32 \
        --kv "$spec" --json "$json" >/dev/null 2>"$err"
    b1=$(busy_ticks); o1=$(own_ticks); t1=$(date +%s%N)
    # cores used by other processes during the run
    python3 -c "import sys; b,o,ns,hz=map(float,sys.argv[1:]); print(max(0.0,(b-o)/hz/(ns/1e9)))" \
        $((b1 - b0)) $((o1 - o0)) $((t1 - t0)) "$(getconf CLK_TCK)" >"$RAW/${tag}__r$r.foreign"
}

# BUDGET as a spec item: a fraction (0.1, 10%) is budget=, a whole number of slots is slots=.
case $BUDGET in *.* | *%) B_ITEM="budget=$BUDGET" ;; *) B_ITEM="slots=$BUDGET" ;; esac
specs=()
for p in $POLICIES; do
    if [ "$p" = full ]; then specs+=("full"); else specs+=("$p:$B_ITEM"); fi
done
specs+=("hashevict:$B_ITEM,prefill=recent")
tag_of() { echo "$1" | sed 's/[:,=]/_/g'; }

log "synthetic 85.7M f32, prompt $N_PROMPT, $N_GEN decoded, $THREADS threads, budget $BUDGET, $ROUNDS rounds"
for r in $(seq 1 "$ROUNDS"); do
    for s in "${specs[@]}"; do run_one "$s" "$(tag_of "$s")" "$r"; done
done
if [ "$PAPER" = 1 ]; then
    s="hashevict:$B_ITEM"
    specs+=("$s")
    run_one "$s" "$(tag_of "$s")" 1
fi

python3 - "$RAW" "$N_PROMPT" "$N_GEN" "$THREADS" "$BUDGET" "${specs[@]}" <<'PY'
import glob, json, os, re, statistics, sys
out, n_prompt, n_gen, threads, budget, specs = sys.argv[1], *sys.argv[2:6], sys.argv[6:]
tag = lambda s: re.sub(r'[:,=]', '_', s)
mib = lambda b: f"{b / 2**20:.1f} MiB"
rows, summary = [], []
for s in specs:
    runs = sorted(glob.glob(f"{out}/{tag(s)}__r*.json"))
    if not runs:
        continue
    js = [json.load(open(f)) for f in runs]
    med = lambda k: statistics.median(j[k] for j in js)
    foreign = [float(open(f[:-5] + '.foreign').read()) for f in runs]
    timing = {}
    for f in runs:
        for line in open(f[:-5] + '.log'):
            m = re.search(r'timing, (decode|fed prompt tokens): (\d+) steps; per step: hash ([\d.]+) us, '
                          r'victim search ([\d.]+) us, evict \(store removal \+ table\) ([\d.]+) us', line)
            if m:
                timing.setdefault(m.group(1), []).append(tuple(float(x) for x in m.groups()[2:]))
    t = {k: tuple(statistics.median(x[i] for x in v) for i in range(3)) for k, v in timing.items()}
    rows.append((s, len(js), med('prefill_tok_s'), med('decode_tok_s'), med('decode_kv_share'),
                 js[-1]['kv_bytes'], js[-1]['kv_bytes_peak'], js[-1]['peak_rss_bytes'],
                 max(foreign), t))
    summary.append({'kv': s, 'runs': len(js), 'prefill_tok_s': med('prefill_tok_s'),
                    'decode_tok_s': med('decode_tok_s'), 'decode_kv_share': med('decode_kv_share'),
                    'kv_bytes': js[-1]['kv_bytes'], 'kv_bytes_peak': js[-1]['kv_bytes_peak'],
                    'peak_rss_bytes': js[-1]['peak_rss_bytes'], 'foreign_load_max': max(foreign),
                    'hashevict_us_per_step': {k: dict(zip(('hash', 'victim', 'evict'), v))
                                              for k, v in t.items()}})
full = next((r[3] for r in rows if r[0] == 'full'), None)
print(f"synthetic 85.7M (f32 weights, f32 KV), prompt {n_prompt}, {n_gen} decoded, {threads} "
      f"threads, budget {budget}; medians over the runs\n")
print("| KV policy | runs | prefill tok/s | decode tok/s | decode vs full | decode time in KV layer "
      "| KV bytes at end | KV peak | peak RSS | foreign load (max) |")
print("|---|---|---|---|---|---|---|---|---|---|")
for s, n, pf, dc, share, kvb, kvp, rss, fl, t in rows:
    ratio = f"{dc / full:.2f}x" if full else "-"
    print(f"| {s} | {n} | {pf:.1f} | {dc:.1f} | {ratio} | {100 * share:.1f}% | {mib(kvb)} | "
          f"{mib(kvp)} | {mib(rss)} | {fl:.2f} cores |")
print("\nHashEvict per step (all 12 layers x 12 KV heads), microseconds:\n")
print("| KV policy | phase | hash | victim search | evict (store removal + table) | "
      "share of a decode step |")
print("|---|---|---|---|---|---|")
for s, n, pf, dc, share, kvb, kvp, rss, fl, t in rows:
    for phase, (h, v, e) in sorted(t.items()):
        step_us = 1e6 / dc if phase == 'decode' else None
        sh = f"{100 * (h + v + e) / step_us:.1f}%" if step_us else "-"
        print(f"| {s} | {phase} | {h:.1f} | {v:.1f} | {e:.1f} | {sh} |")
json.dump(summary, open(f"{out}/results.json", "w"), indent=1)
PY
