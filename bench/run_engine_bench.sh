#!/usr/bin/env bash
# kvslim vs llama.cpp on the very same GGUF files, in one run, reported as same-run ratios.
#
#   bench/run_engine_bench.sh [BUILD_DIR]          (default BUILD_DIR: <repo>/build-bench)
#
# For each weight type (f32, q8_0) the synthetic 85.7M llama (dim 768, hidden 2048, 12 layers,
# 12 heads, vocab 512) is written once with `kvslim bench --synthetic ... --save`; then for each
# thread count (1, 2) kvslim and llama.cpp are timed on that file with the same prompt length
# and decode steps, the engines alternating in order from one config to the next, for ROUNDS
# rounds. The table shows medians over the rounds; each ratio is the median of the per-round
# ratios kvslim / llama.cpp (> 1: kvslim faster), i.e. of runs made a few seconds apart.
#
# llama.cpp is the prebuilt CPU build that the npm package node-llama-cpp ships
# (@node-llama-cpp/linux-x64; the ggml loader picks the CPU variant, e.g. zen4). It is installed
# from bench/llamacpp/package-lock.json into BUILD_DIR/bench/llamacpp/ on first use
# (npm install --ignore-scripts: nothing is compiled or downloaded by install scripts; about
# 85 MB). Two harnesses:
#   capi  bench/llamacpp/llamacpp_capi_bench.c, compiled here against the llama.cpp headers of
#         the same release (taken from the git bundle inside the node-llama-cpp package) and
#         linked to the shipped libraries; attaches a persistent ggml threadpool as llama-bench
#         does. This is the llama.cpp column of the main table.
#   node  bench/llamacpp/llamacpp_bench.mjs through node-llama-cpp's JS API; reported in a
#         second table. node-llama-cpp attaches no threadpool, so ggml makes a throw-away one
#         for every llama_decode; with 2 threads that costs a lot on decode (see the report).
# Without npm/node, kvslim runs alone and the script says so. KV cache: llama.cpp F16 (its
# default), kvslim F32.
#
# Environment: N_PROMPT (512), N_GEN (128), TYPES ("f32 q8_0"), THREADS ("1 2"), ROUNDS (3),
#   SHAPE (dim=768,hidden=2048,layers=12,heads=12,kv_heads=12,vocab=512),
#   LLAMACPP_HARNESS (both | capi | node | none; default both), NO_BUILD=1 (don't rebuild kvslim),
#   QUIET_WAIT (60: before each run, wait up to this many seconds for other processes to use
#   < 0.15 cores), RETRIES (2: rerun a run during which others used >= 0.25 cores).
# Output: markdown tables on stdout, progress on stderr, everything in BUILD_DIR/bench/engine.json
# (raw per-run JSON in BUILD_DIR/bench/raw/, models in BUILD_DIR/bench/models/).
# A benchmark, not a test: it takes minutes and must not run in tests or CI.
set -euo pipefail

if [ -n "${CI:-}" ]; then
    echo "run_engine_bench.sh: not run in CI (benchmark)" >&2
    exit 0
fi

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${1:-$REPO/build-bench}
mkdir -p "$BUILD_DIR"
BUILD_DIR=$(cd "$BUILD_DIR" && pwd)
N_PROMPT=${N_PROMPT:-512}
N_GEN=${N_GEN:-128}
TYPES=${TYPES:-f32 q8_0}
THREADS=${THREADS:-1 2}
ROUNDS=${ROUNDS:-3}
SHAPE=${SHAPE:-dim=768,hidden=2048,layers=12,heads=12,kv_heads=12,vocab=512}
HARNESS=${LLAMACPP_HARNESS:-both}
QUIET_WAIT=${QUIET_WAIT:-60}
RETRIES=${RETRIES:-2}
NLC_VERSION=3.22.1

OUT=$BUILD_DIR/bench
LL=$OUT/llamacpp
RAW=$OUT/raw
MODELS=$OUT/models
mkdir -p "$OUT" "$RAW" "$MODELS"
rm -f "$RAW"/*.json "$RAW"/*.load

log() { printf '%s\n' "$*" >&2; }
have() { command -v "$1" >/dev/null 2>&1; }

have python3 || { log "run_engine_bench.sh: needs python3 (to assemble the results)"; exit 1; }

# --- kvslim -------------------------------------------------------------------------------
if [ "${NO_BUILD:-0}" != 1 ]; then
    log "== building kvslim in $BUILD_DIR"
    if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
        cmake -S "$REPO" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release >&2
    fi
    cmake --build "$BUILD_DIR" -j2 --target kvslim >&2
fi
KVSLIM=$BUILD_DIR/kvslim
[ -x "$KVSLIM" ] || { log "run_engine_bench.sh: no $KVSLIM"; exit 1; }

# --- llama.cpp (node-llama-cpp's prebuilt binaries) ----------------------------------------
NOTES=()
LLAMA_CAPI=""
LLAMA_NODE=""
LIBDIR=$LL/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64
NLC_PKG=$LL/node_modules/node-llama-cpp
install_npm() {
    local stamp=$LL/.installed lock_sum
    lock_sum=$(cat "$REPO/bench/llamacpp/package.json" "$REPO/bench/llamacpp/package-lock.json" | cksum)
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$lock_sum" ] && [ -d "$LIBDIR" ] && [ -f "$NLC_PKG/package.json" ]; then
        return 0
    fi
    log "== installing node-llama-cpp $NLC_VERSION into $LL (npm install --ignore-scripts, lockfile)"
    mkdir -p "$LL"
    cp "$REPO/bench/llamacpp/package.json" "$REPO/bench/llamacpp/package-lock.json" "$LL/"
    # Not `npm ci`: some of node-llama-cpp's optional platform packages (win-*, mac-*, riscv64)
    # are not published at 3.22.1, so the lockfile lacks them and `npm ci` refuses it. `npm
    # install` with the lockfile installs exactly the locked versions and leaves the lock as is.
    (cd "$LL" && npm install --ignore-scripts --omit=optional --no-audit --no-fund >&2) || return 1
    [ -d "$LIBDIR" ] || return 1
    echo "$lock_sum" >"$stamp"
}
if [ "$HARNESS" = none ]; then
    NOTES+=("llama.cpp not run (LLAMACPP_HARNESS=none)")
elif ! have node || ! have npm; then
    NOTES+=("llama.cpp not run: node/npm not found; kvslim alone")
    log "run_engine_bench.sh: node/npm not found: running kvslim alone"
elif ! install_npm; then
    NOTES+=("llama.cpp not run: npm install of node-llama-cpp failed; kvslim alone")
    log "run_engine_bench.sh: npm install failed: running kvslim alone"
else
    LLAMA_TAG=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["tag"])' \
        "$NLC_PKG/llama/llama.cpp.info.json" 2>/dev/null || echo unknown)
    if [ "$HARNESS" = both ] || [ "$HARNESS" = capi ]; then
        # Headers of the very release the shipped libraries were built from.
        HDR=$LL/llama.cpp-headers
        if [ ! -f "$HDR/.tag" ] || [ "$(cat "$HDR/.tag")" != "$LLAMA_TAG" ]; then
            log "== extracting llama.cpp $LLAMA_TAG headers from node-llama-cpp's git bundle"
            rm -rf "$HDR" "$LL/bundle.git"
            mkdir -p "$HDR"
            if have git && git init -q --bare "$LL/bundle.git" &&
                git -C "$LL/bundle.git" fetch -q "$NLC_PKG/llama/gitRelease.bundle" HEAD &&
                git -C "$LL/bundle.git" archive FETCH_HEAD include ggml/include | tar -x -C "$HDR"; then
                echo "$LLAMA_TAG" >"$HDR/.tag"
            fi
            rm -rf "$LL/bundle.git"
        fi
        LIBLLAMA=$(ls "$LIBDIR"/libllama*.so 2>/dev/null | grep -v common | head -n1 || true)
        LIBGGML=$(ls "$LIBDIR"/libggml.*so 2>/dev/null | head -n1 || true)
        SRC=$REPO/bench/llamacpp/llamacpp_capi_bench.c
        BIN=$LL/llamacpp_capi_bench
        if [ -f "$HDR/.tag" ] && [ -n "$LIBLLAMA" ] && [ -n "$LIBGGML" ]; then
            if [ ! -x "$BIN" ] || [ "$SRC" -nt "$BIN" ] || [ "$HDR/.tag" -nt "$BIN" ]; then
                log "== compiling $BIN"
                ${CC:-cc} -std=c11 -O2 -Wall -DLLAMACPP_TAG="\"$LLAMA_TAG\"" \
                    -I "$HDR/include" -I "$HDR/ggml/include" "$SRC" -o "$BIN" \
                    "$LIBLLAMA" "$LIBGGML" "$LIBDIR/libggml-base.so" -Wl,-rpath,"$LIBDIR" >&2 ||
                    rm -f "$BIN"
            fi
        fi
        if [ -x "$BIN" ]; then
            LLAMA_CAPI=$BIN
        else
            NOTES+=("llama.cpp C-API harness unavailable (headers or compile failed)")
            log "run_engine_bench.sh: C-API harness unavailable"
        fi
    fi
    if [ "$HARNESS" = both ] || [ "$HARNESS" = node ]; then
        LLAMA_NODE=$REPO/bench/llamacpp/llamacpp_bench.mjs
    fi
fi

# --- models ---------------------------------------------------------------------------------
CTX=$((N_PROMPT + N_GEN + 16))
[ "$CTX" -lt 2048 ] && CTX=2048
for type in $TYPES; do
    log "== writing synthetic model ($SHAPE,type=$type) to $MODELS/synthetic-$type.gguf"
    "$KVSLIM" bench --synthetic "$SHAPE,ctx=$CTX,type=$type" --save "$MODELS/synthetic-$type.gguf" \
        -p 1 -n 1 -t 1 >/dev/null
done

# --- runs -------------------------------------------------------------------------------------
# The machine may be shared: around each run, the CPU time of the whole machine (/proc/stat)
# minus that of the run itself (this shell's cutime + cstime) gives the load of other
# processes during the run, reported as "foreign load" in cores. Before each run the script
# waits for a quiet machine, and a run disturbed all the same is done again.
cpu_snapshot() { # PID -> busy ticks of all CPUs, CPU ticks of PID's waited-for children, wall ns
    local c st
    read -r -a c </proc/stat
    read -r st </proc/"$1"/stat
    set -- ${st##*) }   # $1 is field 3 (state); cutime, cstime are fields 16, 17
    echo "$((c[1] + c[2] + c[3] + c[6] + c[7] + c[8])) $((${14} + ${15})) $(date +%s%N)"
}
busy_cores_1s() { # CPU use of the whole machine over one second, in cores x 100
    local a b
    read -r -a a </proc/stat
    sleep 1
    read -r -a b </proc/stat
    echo $(((b[1] + b[2] + b[3] + b[6] + b[7] + b[8] - a[1] - a[2] - a[3] - a[6] - a[7] - a[8]) * 100 / $(getconf CLK_TCK)))
}
wait_quiet() { # wait (at most QUIET_WAIT s) until other processes use < 0.15 cores
    local waited=0 busy
    while busy=$(busy_cores_1s) && [ "$busy" -ge 15 ] && [ "$waited" -lt "$QUIET_WAIT" ]; do
        [ "$waited" -eq 0 ] && log "   machine busy (${busy}% of a core used by others): waiting up to ${QUIET_WAIT}s"
        waited=$((waited + 1))
    done
}
run_engine_once() { # engine type threads round -> echoes the foreign load x 100
    local engine=$1 type=$2 t=$3 r=$4 model=$MODELS/synthetic-$2.gguf
    local json=$RAW/${engine}__${type}__t${t}__r${r}.json before after me=$BASHPID
    wait_quiet
    before=$(cpu_snapshot "$me")
    case $engine in
    kvslim) "$KVSLIM" bench -m "$model" -p "$N_PROMPT" -n "$N_GEN" -t "$t" --kv-type f32 --json "$json" >/dev/null ;;
    llama-capi) "$LLAMA_CAPI" -m "$model" -p "$N_PROMPT" -n "$N_GEN" -t "$t" --json "$json" >/dev/null ;;
    llama-node) node "$LLAMA_NODE" --node-modules "$LL/node_modules" -m "$model" \
        -p "$N_PROMPT" -n "$N_GEN" -t "$t" --json "$json" >/dev/null ;;
    esac || { log "run_engine_bench.sh: $engine failed ($type, t=$t, round $r)"; rm -f "$json"; echo 0; return 0; }
    after=$(cpu_snapshot "$me")
    echo "$engine $type $t $r $before $after $(getconf CLK_TCK)" >"$RAW/${engine}__${type}__t${t}__r${r}.load"
    [ -f "$json" ] && log "   $(sed -E 's/.*"prefill_tok_s": ?([0-9.]+).*"decode_tok_s": ?([0-9.]+).*/prefill \1 tok\/s, decode \2 tok\/s/' "$json")"
    set -- $before $after
    local hz wall_ticks
    hz=$(getconf CLK_TCK)
    wall_ticks=$((($6 - $3) * hz / 1000000000))
    [ "$wall_ticks" -gt 0 ] || wall_ticks=1
    echo $((((($4 - $1) - ($5 - $2)) * 100) / wall_ticks))
}
run_engine() { # engine type threads round: reruns (RETRIES times) a run disturbed by others
    local attempt foreign
    for attempt in $(seq 0 "$RETRIES"); do
        log "-- round $4/$ROUNDS  $2  t=$3  $1${attempt:+$([ "$attempt" -gt 0 ] && echo "  (retry $attempt)")}"
        foreign=$(run_engine_once "$@")
        [ "$foreign" -lt 25 ] && return 0
        log "   other processes used ${foreign}% of a core during the run"
    done
}
ENGINES=(kvslim)
[ -n "$LLAMA_CAPI" ] && ENGINES+=(llama-capi)
[ -n "$LLAMA_NODE" ] && ENGINES+=(llama-node)
k=0
for r in $(seq 1 "$ROUNDS"); do
    for type in $TYPES; do
        for t in $THREADS; do
            # Alternate the order of the engines from one config to the next.
            n=${#ENGINES[@]}
            for i in $(seq 0 $((n - 1))); do
                if [ $((k % 2)) -eq 0 ]; then e=${ENGINES[$i]}; else e=${ENGINES[$((n - 1 - i))]}; fi
                run_engine "$e" "$type" "$t" "$r"
            done
            k=$((k + 1))
        done
    done
done

# --- report -----------------------------------------------------------------------------------
NOTES_TEXT=$(printf '%s\n' "${NOTES[@]+"${NOTES[@]}"}")
python3 - "$RAW" "$OUT/engine.json" "$N_PROMPT" "$N_GEN" "$ROUNDS" "$SHAPE" "$TYPES" "$THREADS" \
    "$NOTES_TEXT" <<'EOF'
import glob, json, os, platform, statistics, sys, time

raw, out, n_prompt, n_gen, rounds, shape, types, threads, notes = sys.argv[1:10]
types, threads = types.split(), [int(t) for t in threads.split()]
runs = []
for path in sorted(glob.glob(os.path.join(raw, "*.json"))):
    engine, type_, t, r = os.path.basename(path)[:-5].split("__")  # kvslim__q8_0__t2__r1
    with open(path) as f:
        d = json.load(f)
    runs.append(dict(engine=engine, type=type_, threads=int(t[1:]), round=int(r[1:]), result=d))

foreign = {}
for path in glob.glob(os.path.join(raw, "*.load")):
    with open(path) as f:
        e, ty, t, r, b0, c0, w0, b1, c1, w1, hz = f.read().split()
    wall = (int(w1) - int(w0)) * 1e-9 * int(hz)
    foreign[(e, ty, int(t), int(r))] = max(0.0, ((int(b1) - int(b0)) - (int(c1) - int(c0))) / wall) if wall > 0 else None
for x in runs:
    x["result"]["foreign_load_cores"] = foreign.get((x["engine"], x["type"], x["threads"], x["round"]))

def get(engine, type_, t, field):
    return {x["round"]: x["result"].get(field) for x in runs
            if x["engine"] == engine and x["type"] == type_ and x["threads"] == t}

def med(values):
    v = [x for x in values if isinstance(x, (int, float))]
    return statistics.median(v) if v else None

def ratio_median(a, b):
    rs = [a[r] / b[r] for r in a if r in b and a[r] and b[r]]
    return statistics.median(rs) if rs else None

def fmt(x, nd=1):
    return "-" if x is None else f"{x:.{nd}f}"

summary = []
for type_ in types:
    for t in threads:
        row = dict(type=type_, threads=t)
        for phase in ("prefill", "decode"):
            f = f"{phase}_tok_s"
            kv = get("kvslim", type_, t, f)
            row[f"kvslim_{phase}_tok_s"] = med(kv.values())
            for h in ("capi", "node"):
                ll = get(f"llama-{h}", type_, t, f)
                row[f"llama_{h}_{phase}_tok_s"] = med(ll.values())
                row[f"{phase}_ratio_vs_{h}"] = ratio_median(kv, ll)
        row["llama_node_js_overhead_us_per_step"] = med(get("llama-node", type_, t, "js_overhead_us_per_step").values())
        row["rounds"] = len(get("kvslim", type_, t, "prefill_tok_s"))
        loads = [x["result"]["foreign_load_cores"] for x in runs if x["type"] == type_ and x["threads"] == t
                 and x["result"].get("foreign_load_cores") is not None]
        row["max_foreign_load_cores"] = max(loads) if loads else None
        summary.append(row)

def first(engine, field):
    for x in runs:
        if x["engine"] == engine and x["result"].get(field) is not None:
            return x["result"][field]
    return None

cpu = ""
try:
    with open("/proc/cpuinfo") as f:
        cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "")
except OSError:
    pass
info = dict(
    date=time.strftime("%Y-%m-%dT%H:%M:%S%z"), host_cpu=cpu, n_cpus=os.cpu_count(),
    shape=shape, n_prompt=int(n_prompt), n_gen=int(n_gen), rounds=int(rounds),
    ratio="kvslim / llama.cpp tok/s, median of per-round ratios (> 1: kvslim faster)",
    kvslim_kv_type="f32",
    llama_cpp=dict(release=first("llama-capi", "llama_cpp_release") or first("llama-node", "llama_cpp_release"),
                   node_llama_cpp=first("llama-node", "node_llama_cpp"),
                   ggml_cpu_backend=first("llama-capi", "ggml_cpu_backend") or first("llama-node", "ggml_cpu_backend"),
                   kv_type=first("llama-capi", "kv_type_k") or first("llama-node", "kv_type_k"),
                   flash_attn=first("llama-capi", "flash_attn") if first("llama-capi", "flash_attn") is not None else first("llama-node", "flash_attn"),
                   batch_size=first("llama-capi", "batch_size") or first("llama-node", "batch_size")),
    notes=[n for n in notes.splitlines() if n],
)
with open(out, "w") as f:
    json.dump(dict(info=info, summary=summary, runs=runs), f, indent=1)
    f.write("\n")

have_capi = any(x["engine"] == "llama-capi" for x in runs)
have_node = any(x["engine"] == "llama-node" for x in runs)
lc = info["llama_cpp"]
print(f"kvslim vs llama.cpp, synthetic {shape}, -p {n_prompt} -n {n_gen}, "
      f"median of {rounds} round(s); ratio = kvslim / llama.cpp")
if have_capi or have_node:
    print(f"llama.cpp {lc['release']} (node-llama-cpp prebuilt), ggml CPU backend {lc['ggml_cpu_backend']}, "
          f"KV {lc['kv_type']} (kvslim: f32), flash_attn {json.dumps(lc['flash_attn'])}, "
          f"n_batch = n_ubatch = {lc['batch_size']}, persistent threadpool (C API harness)")
for n in info["notes"]:
    print(f"note: {n}")
print()
main = "capi" if have_capi else "node"
label = {"capi": "llama.cpp", "node": "llama.cpp (node)"}[main]
print(f"| type | threads | kvslim prefill | {label} prefill | ratio | kvslim decode | {label} decode | ratio |")
print("|---|---|---|---|---|---|---|---|")
for s in summary:
    print(f"| {s['type']} | {s['threads']} | {fmt(s['kvslim_prefill_tok_s'])} | {fmt(s[f'llama_{main}_prefill_tok_s'])} | "
          f"{fmt(s[f'prefill_ratio_vs_{main}'], 2)} | {fmt(s['kvslim_decode_tok_s'])} | "
          f"{fmt(s[f'llama_{main}_decode_tok_s'])} | {fmt(s[f'decode_ratio_vs_{main}'], 2)} |")
if have_capi and have_node:
    print()
    print("llama.cpp through node-llama-cpp's JS API (no persistent threadpool; tok/s from llama.cpp's perf counters, "
          "JS overhead = wall - counters per decode step):")
    print()
    print("| type | threads | llama.cpp (node) prefill | ratio | llama.cpp (node) decode | ratio | JS overhead us/step |")
    print("|---|---|---|---|---|---|---|")
    for s in summary:
        print(f"| {s['type']} | {s['threads']} | {fmt(s['llama_node_prefill_tok_s'])} | {fmt(s['prefill_ratio_vs_node'], 2)} | "
              f"{fmt(s['llama_node_decode_tok_s'])} | {fmt(s['decode_ratio_vs_node'], 2)} | "
              f"{fmt(s['llama_node_js_overhead_us_per_step'], 0)} |")
print()
busy = [f"{s['type']} t={s['threads']}: {s['max_foreign_load_cores']:.2f}" for s in summary
        if s["max_foreign_load_cores"] is not None and s["max_foreign_load_cores"] > 0.1]
if busy:
    print("warning: other processes used CPU during some runs (max foreign load, cores): " + "; ".join(busy))
print(f"tok/s; results in {out}")
EOF
