#!/usr/bin/env bash
# kvslim against llama.cpp built from source for this CPU (llama-bench), on the very same GGUF
# files, in one run: prefill and decode tok/s, same-run ratios, and a memory-bandwidth roofline.
#
#   bench/native_bench.sh [BUILD_DIR]          (default BUILD_DIR: <repo>/build)
#   bench/native_bench.sh -h | --help          (this text)
#
# Models: for each weight type the synthetic 85.7M llama (bench/lib.sh's BENCH_SHAPE; SHAPE
# overrides it, for tests) is written once with `kvslim bench --synthetic SHAPE,ctx=C,type=T
# --save` into BUILD_DIR/bench/models/ (C = the deepest row + 64). Q4_K_M mixes Q4_K with Q6_K
# per tensor as llama.cpp's rules do.
# Rows (ROWS selects a subset by name; default all):
#   pp512        a prompt of N_PP tokens into an empty cache (prefill tok/s)
#   tg128        N_TG tokens decoded one at a time from depth 0 (kvslim's after a 1-token prompt)
#   tg32@D       N_TG_DEPTH tokens decoded after a prefilled context of D tokens, D in DEPTHS
#   pp8192       a prompt of N_PP_LONG tokens into an empty cache
# (the names follow the settings: N_PP=32 makes the first row pp32.)
# Configurations: kvslim `full` (F16 KV cache, `kvslim bench -m FILE -p P -n N -t T`), and on
# the depth rows also --kv snapkv:budget=0.1, nacl:budget=0.1, streaming:budget=0.1 (10% of
# the prompt); EXACT=1 adds `exact` (full with --exact-matmul) on every row. llama.cpp
# (llama-bench -r 1 -o json -t T; pp: -p P -n 0, tg: -p 0 -n N [-d D]): `default` (its own
# defaults), `fa0` (-fa off), `fa1` (-fa on), `fa1-q8` (-fa on -ctk q8_0 -ctv q8_0); a failing
# configuration is logged and skipped. "llama.cpp best" is, in each round, the fastest of them.
# For each type, thread count and round: bench/tools/membw.c (built into BUILD_DIR/bench/membw)
# measures the read bandwidth with that many threads, then kvslim and llama.cpp run all rows,
# the engine order alternating from round to round. Medians over the rounds; each ratio is the
# median of the per-round ratios (> 1: kvslim faster).
# Roofline (decode rows): bandwidth = the max of membw's GB/s over the rounds of the row's own
# type and thread count, measured in the same minutes as the row (the machine's bandwidth moves
# by tens of percent over a run); the share of the run's highest bandwidth for that thread
# count is printed too (the strict roofline, in its own column). Bytes per token = the bytes
# of every weight tensor but the token embedding (summed from the GGUF's tensor table; the
# embedding counts too when there is no output.weight) + the KV bytes read per token: layers *
# (D + N/2) * 2 * kv_dim * bytes per element (F16 2, q8_0 34/32) for full caches, kvslim's
# reported kv_bytes for its compressed caches. roofline tok/s = bandwidth / bytes per token;
# each engine's share = measured / roofline.
#
# The peer: LLAMA_BENCH=path/to/llama-bench, or PEER_DIR/build/bin/llama-bench (PEER_DIR
# default: ../peer-llamacpp beside the repository), built when missing from LLAMACPP_GIT (the
# bare git directory of a fetched snapshot of github:ngxson/llama.cpp; default
# ../.mirror/ngxson+llama.cpp/repo beside the repository, when it exists) with
# ../shared/peers/build-llamacpp.sh (CPU-only Release, GGML_NATIVE=ON; about 6 minutes).
#
# Environment: TYPES ("f32 q8_0 q4_k_m q6_k"), THREADS ("1 2"), ROUNDS (3), ROWS (all),
#   DEPTHS ("2048 8192 16384"), N_PP (512), N_TG (128), N_TG_DEPTH (32), N_PP_LONG (8192),
#   SHAPE (BENCH_SHAPE), MEMBW_BYTES (1073741824), MEMBW_REPS (3), PEER_COMMIT (reported;
#   default: LLAMACPP_GIT's HEAD, else llama-bench's build_commit), EXACT=1, NO_BUILD=1 (don't
#   rebuild kvslim), REPORT_ONLY=1 (run nothing: print the tables of the runs already in
#   BUILD_DIR/bench/native-raw/, e.g. runs of several invocations copied together; ROWS names
#   the rows to report).
# Output: markdown tables, a footer (peer, commit, build flags, CPU, bandwidth, rounds) and an
# acceptance block (the issue's targets, PASS/MISS each) on stdout; progress on stderr;
# BUILD_DIR/bench/native.json (every median), raw per-run JSON in BUILD_DIR/bench/native-raw/.
# A benchmark, not a test: at full size it takes hours and must not run in tests or CI.
set -euo pipefail

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }
case ${1:-} in -h | --help) usage; exit 0 ;; esac

if [ -n "${CI:-}" ]; then
    echo "native_bench.sh: not run in CI (benchmark)" >&2
    exit 0
fi
REPO=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$REPO/build}
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$REPO/bench/lib.sh"
log() { echo "$*" >&2; }
die2() { log "native_bench.sh: $*"; exit 2; }

TYPES=${TYPES:-"f32 q8_0 q4_k_m q6_k"}
THREADS=${THREADS:-"1 2"}
ROUNDS=${ROUNDS:-3}
DEPTHS=${DEPTHS:-"2048 8192 16384"}
N_PP=${N_PP:-512}
N_TG=${N_TG:-128}
N_TG_DEPTH=${N_TG_DEPTH:-32}
N_PP_LONG=${N_PP_LONG:-8192}
SHAPE=${SHAPE:-$BENCH_SHAPE}
MEMBW_BYTES=${MEMBW_BYTES:-1073741824}
MEMBW_REPS=${MEMBW_REPS:-3}

# Whole numbers >= 1 (a list: one or more, blank-separated).
need_counts() { # NAME VALUE
    local v n=0
    for v in $2; do
        if ! [[ $v =~ ^[0-9]+$ ]] || [ "$((10#$v))" -lt 1 ]; then
            die2 "$1='$2': expected whole numbers >= 1"
        fi
        n=$((n + 1))
    done
    [ "$n" -ge 1 ] || die2 "$1 is empty"
}
for knob in ROUNDS N_PP N_TG N_TG_DEPTH N_PP_LONG MEMBW_REPS; do
    need_counts "$knob" "${!knob}"
    [ "$(wc -w <<<"${!knob}")" -eq 1 ] || die2 "$knob='${!knob}': expected one number"
done
need_counts THREADS "$THREADS"
need_counts DEPTHS "$DEPTHS"
need_counts MEMBW_BYTES "$MEMBW_BYTES"
[ "$MEMBW_BYTES" -ge 1048576 ] || die2 "MEMBW_BYTES=$MEMBW_BYTES: at least 1048576"
for t in $TYPES; do
    case $t in f32 | f16 | bf16 | q8_0 | q4_0 | q4_k | q5_k | q6_k | q4_k_m | q5_k_m) ;;
    *) die2 "TYPES: unknown weight type '$t'" ;;
    esac
done
[ -n "${TYPES// /}" ] || die2 "TYPES is empty"
[[ $SHAPE =~ ^[a-z_]+=[0-9]+(,[a-z_]+=[0-9]+)*$ ]] || die2 "SHAPE='$SHAPE': expected key=value,..."

ALL_ROWS="pp$N_PP tg$N_TG"
for d in $DEPTHS; do ALL_ROWS="$ALL_ROWS tg$N_TG_DEPTH@$d"; done
ALL_ROWS="$ALL_ROWS pp$N_PP_LONG"
ROWS=${ROWS:-$ALL_ROWS}
for row in $ROWS; do
    [[ " $ALL_ROWS " == *" $row "* ]] || die2 "ROWS: unknown row '$row' (rows with these settings: $ALL_ROWS)"
done
# The context the deepest row needs (+ 64).
need=$((N_PP > N_PP_LONG ? N_PP : N_PP_LONG))
[ $((1 + N_TG)) -le "$need" ] || need=$((1 + N_TG))
for d in $DEPTHS; do [ $((d + N_TG_DEPTH)) -le "$need" ] || need=$((d + N_TG_DEPTH)); done
CTX=$((need + 64))

OUT=$BUILD/bench
RAW=$OUT/native-raw
MODELS=$OUT/models
# Another shape (a test): its own directory, so that its files never pass for BENCH_SHAPE's.
[ "$SHAPE" = "$BENCH_SHAPE" ] || MODELS=$OUT/models/shape-$(tr ',=' '_-' <<<"$SHAPE")
mkdir -p "$MODELS" "$RAW"
[ -n "${REPORT_ONLY:-}" ] || rm -f "$RAW"/*.json "$RAW"/*.txt

[ -n "${NO_BUILD:-}" ] || make -C "$REPO" build >/dev/null
KVSLIM=$BUILD/kvslim
[ -x "$KVSLIM" ] || { log "native_bench.sh: $KVSLIM not built"; exit 1; }

MEMBW=$OUT/membw
if [ ! -x "$MEMBW" ] || [ "$REPO/bench/tools/membw.c" -nt "$MEMBW" ]; then
    cc -std=c11 -O2 -march=native -pthread -o "$MEMBW" "$REPO/bench/tools/membw.c" ||
        { log "native_bench.sh: cannot build $MEMBW"; exit 1; }
fi

PEER_DIR=${PEER_DIR:-$REPO/../peer-llamacpp}
if [ -z "${LLAMACPP_GIT:-}" ] && [ -d "$REPO/../.mirror/ngxson+llama.cpp/repo" ]; then
    LLAMACPP_GIT=$(cd "$REPO/../.mirror/ngxson+llama.cpp/repo" && pwd)
fi
LLAMACPP_GIT=${LLAMACPP_GIT:-}
LLAMA_BENCH=${LLAMA_BENCH:-$PEER_DIR/build/bin/llama-bench}
if [ ! -x "$LLAMA_BENCH" ]; then
    [ -n "$LLAMACPP_GIT" ] || {
        log "native_bench.sh: no llama-bench at $LLAMA_BENCH, and no snapshot to build it from:"
        log "  fetch github:ngxson/llama.cpp and set LLAMACPP_GIT to its bare git directory (or set LLAMA_BENCH)"
        exit 1
    }
    log "== building llama-bench in $PEER_DIR from $LLAMACPP_GIT (about 6 minutes)"
    LLAMA_BENCH=$(bash "$REPO/../shared/peers/build-llamacpp.sh" "$LLAMACPP_GIT" "$PEER_DIR")
fi
# The snapshot's commit (llama-bench built from an extracted tree reports "unknown").
PEER_COMMIT=${PEER_COMMIT:-$( { [ -n "$LLAMACPP_GIT" ] && git -C "$LLAMACPP_GIT" rev-parse HEAD 2>/dev/null; } || echo unknown)}
# The peer's build flags, from its CMake cache (PEER_DIR's, else the one above llama-bench's bin/).
PEER_CACHE=$PEER_DIR/build/CMakeCache.txt
[ -f "$PEER_CACHE" ] || PEER_CACHE=$(dirname "$LLAMA_BENCH")/../CMakeCache.txt
PEER_FLAGS=unknown
if [ -f "$PEER_CACHE" ]; then
    PEER_FLAGS=$(sed -n 's/^GGML_NATIVE:[A-Z]*=\(.*\)/GGML_NATIVE=\1/p; s/^CMAKE_C_FLAGS:[A-Z]*=\(.*\)/CMAKE_C_FLAGS="\1"/p' "$PEER_CACHE" | paste -sd ' ' -)
    PEER_FLAGS=${PEER_FLAGS:-unknown}
fi

KV_POLICIES=(snapkv:budget=0.1 nacl:budget=0.1 streaming:budget=0.1)
KV_NAMES=(snapkv nacl streaming)
KVSLIM_CONFIGS=(full)
[ -z "${EXACT:-}" ] || KVSLIM_CONFIGS+=(exact)
LLAMA_CONFIGS=(default fa0 fa1 fa1-q8)

# row -> "P N D" (prompt, generated, depth) for kvslim
row_shape() {
    case $1 in
    tg*@*) local d=${1#*@}; echo "$d $N_TG_DEPTH $d" ;;
    tg*) echo "1 $N_TG 0" ;;
    pp*) echo "${1#pp} 0 0" ;;
    esac
}

# Raw file names: ENGINE__CONFIG__TYPE__tT__rR__ROW.json
run_kvslim() { # config type model threads round row
    local config=$1 type=$2 model=$3 t=$4 r=$5 row=$6 p n d extra=()
    read -r p n d <<<"$(row_shape "$row")"
    case $config in
    full) ;;
    exact) extra=(--exact-matmul) ;;
    *) local i; for i in "${!KV_NAMES[@]}"; do [ "${KV_NAMES[$i]}" != "$config" ] || extra=(--kv "${KV_POLICIES[$i]}"); done ;;
    esac
    local json=$RAW/kvslim__${config}__${type}__t${t}__r${r}__${row}.json
    "$KVSLIM" bench -m "$model" -p "$p" -n "$n" -t "$t" "${extra[@]}" --json "$json" >/dev/null 2>"$json.err" ||
        { log "native_bench.sh: kvslim $config failed ($type, t=$t, round $r, $row): $(tail -n 1 "$json.err")"; rm -f "$json"; }
    rm -f "$json.err"
}

run_llama() { # config type model threads round row
    local config=$1 type=$2 model=$3 t=$4 r=$5 row=$6 args
    case $row in
    tg*@*) args=(-p 0 -n "$N_TG_DEPTH" -d "${row#*@}") ;;
    tg*) args=(-p 0 -n "$N_TG") ;;
    pp*) args=(-p "${row#pp}" -n 0) ;;
    esac
    case $config in
    fa0) args+=(-fa off) ;;
    fa1) args+=(-fa on) ;;
    fa1-q8) args+=(-fa on -ctk q8_0 -ctv q8_0) ;;
    esac
    local json=$RAW/llama__${config}__${type}__t${t}__r${r}__${row}.json
    "$LLAMA_BENCH" -m "$model" "${args[@]}" -t "$t" -r 1 -o json >"$json" 2>"$json.err" ||
        { log "native_bench.sh: llama.cpp $config failed ($type, t=$t, round $r, $row): $(grep -m1 -i error "$json.err" || tail -n 1 "$json.err")"; rm -f "$json"; }
    rm -f "$json.err"
}

run_engine() { # engine type model threads round
    local engine=$1 type=$2 model=$3 t=$4 r=$5 row c
    for row in $ROWS; do
        if [ "$engine" = kvslim ]; then
            local configs=("${KVSLIM_CONFIGS[@]}")
            [[ $row != *@* ]] || configs+=("${KV_NAMES[@]}")
            for c in "${configs[@]}"; do run_kvslim "$c" "$type" "$model" "$t" "$r" "$row"; done
        else
            for c in "${LLAMA_CONFIGS[@]}"; do run_llama "$c" "$type" "$model" "$t" "$r" "$row"; done
        fi
    done
}

if [ -n "${REPORT_ONLY:-}" ]; then
    [ -s "$RAW/models.txt" ] && [ -s "$RAW/membw.txt" ] ||
        { log "native_bench.sh: REPORT_ONLY: no earlier run in $RAW"; exit 1; }
    TYPES=""
else
    : >"$RAW/models.txt"
    : >"$RAW/membw.txt"
fi
for type in $TYPES; do
    model=$(bench_synthetic "$KVSLIM" "$MODELS" "$SHAPE" "$CTX" "$type" 2)
    echo "$type $model" >>"$RAW/models.txt"
    for t in $THREADS; do
        for r in $(seq 1 "$ROUNDS"); do
            log "== $type t=$t round $r: membw"
            bw=$("$MEMBW" "$t" "$MEMBW_BYTES" "$MEMBW_REPS" 2>/dev/null) ||
                { log "native_bench.sh: membw failed"; exit 1; }
            log "   $bw"
            echo "$type $t $r $bw" >>"$RAW/membw.txt"
            order=(kvslim llama)
            [ $((r % 2)) -eq 0 ] && order=(llama kvslim)
            for e in "${order[@]}"; do
                log "== $type t=$t round $r: $e"
                run_engine "$e" "$type" "$model" "$t" "$r"
            done
        done
    done
done

export RAW OUT ROWS N_TG ROUNDS PEER_COMMIT LLAMA_BENCH PEER_FLAGS SHAPE CTX
python3 - <<'PY'
import glob, json, os, re, statistics, struct, sys
from collections import Counter

env = os.environ
raw, out = env['RAW'], env['OUT']
rows_sel = env['ROWS'].split()
commit, peer, flags = env['PEER_COMMIT'], env['LLAMA_BENCH'], env['PEER_FLAGS']

# --- GGUF: metadata and tensor byte sizes (a minimal reader) ---
# ggml type -> (block elements, block bytes)
GGML = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
        9: (32, 36), 10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176),
        14: (256, 210), 15: (256, 292), 30: (1, 2)}
def gguf(path):
    f = open(path, 'rb')
    def rd(fmt):
        return struct.unpack('<' + fmt, f.read(struct.calcsize('<' + fmt)))[0]
    def rstr():
        return f.read(rd('Q')).decode('utf-8', 'replace')
    scal = {0: 'B', 1: 'b', 2: 'H', 3: 'h', 4: 'I', 5: 'i', 6: 'f', 7: '?', 10: 'Q', 11: 'q', 12: 'd'}
    def rval(t):
        if t == 8:
            return rstr()
        if t == 9:
            et, n = rd('I'), rd('Q')
            return [rval(et) for _ in range(n)]
        return rd(scal[t])
    if f.read(4) != b'GGUF':
        raise ValueError(f'{path}: not GGUF')
    version, n_t, n_kv = rd('I'), rd('Q'), rd('Q')
    meta = {}
    for _ in range(n_kv):
        k = rstr()
        meta[k] = rval(rd('I'))
    tensors = {}
    for _ in range(n_t):
        name = rstr()
        dims = [rd('Q') for _ in range(rd('I'))]
        typ, off = rd('I'), rd('Q')
        n = 1
        for d in dims:
            n *= d
        be, bb = GGML[typ]
        tensors[name] = n // be * bb
    return meta, tensors

models = dict(l.split(None, 1) for l in open(os.path.join(raw, 'models.txt')).read().splitlines() if l)
shape = {}
for typ, path in models.items():
    meta, tensors = gguf(path.strip())
    arch = meta.get('general.architecture', 'llama')
    layers = meta[f'{arch}.block_count']
    dim = meta[f'{arch}.embedding_length']
    heads = meta[f'{arch}.attention.head_count']
    kv_heads = meta.get(f'{arch}.attention.head_count_kv', heads)
    streamed = sum(b for n, b in tensors.items() if n != 'token_embd.weight' or 'output.weight' not in tensors)
    shape[typ] = dict(layers=layers, kv_dim=dim // heads * kv_heads, weight_bytes_per_token=streamed,
                      file_bytes=os.path.getsize(path.strip()), embd_bytes=tensors.get('token_embd.weight', 0))

# --- bandwidth: the max over rounds per type and thread count (cell), and per thread count ---
# (lines "TYPE T ROUND read_gbps G HOW"; runs before the type was recorded: "T ROUND ...", whose
# rows then use the thread count's max)
bw, bw_how, bw_cell = {}, {}, {}
for l in open(os.path.join(raw, 'membw.txt')).read().splitlines():
    f = l.split()
    typ, (t, r, _, gbps, how) = (f[0], f[1:]) if len(f) == 6 else (None, f)
    t, gbps = int(t), float(gbps)
    if gbps > bw.get(t, 0):
        bw[t], bw_how[t] = gbps, how
    if typ is not None and gbps > bw_cell.get((typ, t), 0):
        bw_cell[(typ, t)] = gbps

# --- raw runs: (engine, config, type, t, round, row) -> {tok_s, kv_bytes} ---
runs = {}
for path in glob.glob(os.path.join(raw, '*.json')):
    engine, config, typ, t, r, row = os.path.basename(path)[:-5].split('__')
    try:
        data = json.load(open(path))
    except ValueError:
        print(f'native_bench.sh: unreadable {path}', file=sys.stderr)
        continue
    if engine == 'kvslim':
        v = data['decode_tok_s'] if row.startswith('tg') else data['prefill_tok_s']
        rec = {'tok_s': v, 'kv_bytes': data['kv_bytes'], 'peak_rss_bytes': data['peak_rss_bytes']}
    else:
        want_gen = row.startswith('tg')
        x = next((x for x in data if (x['n_gen'] > 0) == want_gen), None)
        if x is None:
            continue
        rec = {'tok_s': x['avg_ts']}
        if commit == 'unknown' and x.get('build_commit', 'unknown') != 'unknown':
            commit = x['build_commit']
    runs[(engine, config, typ, int(t[1:]), int(r[1:]), row)] = rec

def med(xs):
    return statistics.median(xs) if xs else None
def fmt(x, spec='.1f'):
    return '—' if x is None else format(x, spec)

def row_depth(row):  # (D, N) for decode rows
    if '@' in row:
        return int(row.split('@')[1]), int(row[2:].split('@')[0])
    return 0, int(row[2:])

results, depth_results = [], []
cells = sorted({(k[2], k[3]) for k in runs}, key=lambda c: (list(models).index(c[0]) if c[0] in models else 99, c[1]))
for typ, t in cells:
    sh = shape[typ]
    rounds = sorted({k[4] for k in runs if k[2] == typ and k[3] == t})
    for row in rows_sel:
        decode = row.startswith('tg')
        def per_round(engine, config):
            return {r: runs[(engine, config, typ, t, r, row)] for r in rounds if (engine, config, typ, t, r, row) in runs}
        llama = {c: per_round('llama', c) for c in ('default', 'fa0', 'fa1', 'fa1-q8')}
        best = {}
        for r in rounds:
            got = [(llama[c][r]['tok_s'], c) for c in llama if r in llama[c]]
            if got:
                best[r] = max(got)
        best_cfg = Counter(c for _, c in best.values()).most_common(1)[0][0] if best else None
        kv = {c: per_round('kvslim', c) for c in ('full', 'exact', 'snapkv', 'nacl', 'streaming')}
        kv = {c: v for c, v in kv.items() if v}
        def ratio(a, b):  # median of per-round ratios a/b
            rs = [a[r]['tok_s'] / b[r] for r in a if r in b and b[r] > 0]
            return med(rs)
        best_ts = {r: v[0] for r, v in best.items()}
        rec = {'type': typ, 'threads': t, 'row': row, 'rounds': len(rounds),
               'llama_tok_s': {c: med([x['tok_s'] for x in v.values()]) for c, v in llama.items()},
               'llama_best_tok_s': med(list(best_ts.values())), 'llama_best_config': best_cfg,
               'llama_best_config_per_round': {r: v[1] for r, v in best.items()},
               'kvslim_tok_s': {c: med([x['tok_s'] for x in v.values()]) for c, v in kv.items()},
               'kvslim_kv_bytes': {c: med([x['kv_bytes'] for x in v.values()]) for c, v in kv.items()},
               'kvslim_peak_rss_bytes': {c: med([x['peak_rss_bytes'] for x in v.values()]) for c, v in kv.items()},
               'kvslim_vs_llama_best': {c: ratio(v, best_ts) for c, v in kv.items()},
               'kvslim_vs_llama_default': {c: ratio(v, {r: x['tok_s'] for r, x in llama['default'].items()}) for c, v in kv.items()}}
        if decode:
            D, N = row_depth(row)
            avg = D + N / 2
            full_kv = lambda per_elem: sh['layers'] * avg * 2 * sh['kv_dim'] * per_elem
            W = sh['weight_bytes_per_token']
            B = bw_cell.get((typ, t), bw.get(t))
            roof = {}
            roof['full'] = {'bytes_per_token': W + full_kv(2), 'kv_bytes_per_token': full_kv(2)}
            roof['llama_q8_0'] = {'bytes_per_token': W + full_kv(34 / 32), 'kv_bytes_per_token': full_kv(34 / 32)}
            for c in ('snapkv', 'nacl', 'streaming'):
                if rec['kvslim_kv_bytes'].get(c) is not None:
                    roof[c] = {'bytes_per_token': W + rec['kvslim_kv_bytes'][c], 'kv_bytes_per_token': rec['kvslim_kv_bytes'][c]}
            for v in roof.values():
                v['tok_s'] = B * 1e9 / v['bytes_per_token'] if B else None
            rec['avg_depth'] = avg
            rec['weight_bytes_per_token'] = W
            rec['bandwidth_gbps'] = B
            rec['bandwidth_run_max_gbps'] = bw.get(t)
            rec['roofline'] = roof
            def share(x, key):
                return 100 * x / roof[key]['tok_s'] if x is not None and roof.get(key, {}).get('tok_s') else None
            rec['kvslim_pct_roofline'] = {c: share(rec['kvslim_tok_s'].get(c), 'full' if c in ('full', 'exact') else c) for c in kv}
            # the same shares against the run's highest bandwidth for t (B / that max of them)
            strict = B / bw[t] if B and bw.get(t) else None
            rec['kvslim_pct_run_max_roofline'] = {c: v * strict if v is not None and strict else None
                                                  for c, v in rec['kvslim_pct_roofline'].items()}
            rec['llama_best_pct_roofline'] = share(rec['llama_best_tok_s'], 'llama_q8_0' if best_cfg == 'fa1-q8' else 'full')
            if '@' in row:
                # llama.cpp's F16 cache holding D + N tokens
                rec['llama_f16_kv_bytes'] = sh['layers'] * (D + N) * 2 * sh['kv_dim'] * 2
        results.append(rec)

# --- tables ---
exact = any('exact' in r['kvslim_tok_s'] for r in results)
hdr = ['type', 'threads', 'row', 'llama.cpp default tok/s', 'llama.cpp best tok/s (config)', 'kvslim full tok/s']
if exact:
    hdr.append('kvslim exact tok/s')
hdr += ['kvslim/llama best', 'bandwidth GB/s', 'roofline tok/s', 'kvslim % of roofline',
        "kvslim % of the run's highest bandwidth", 'llama best % of roofline']
print('| ' + ' | '.join(hdr) + ' |')
print('|---' * len(hdr) + '|')
for r in results:
    roof = r.get('roofline', {}).get('full', {}).get('tok_s')
    cols = [r['type'], str(r['threads']), r['row'], fmt(r['llama_tok_s']['default']),
            f"{fmt(r['llama_best_tok_s'])} ({r['llama_best_config'] or '—'})", fmt(r['kvslim_tok_s'].get('full'))]
    if exact:
        cols.append(fmt(r['kvslim_tok_s'].get('exact')))
    ratio = r['kvslim_vs_llama_best'].get('full')
    pct_txt = lambda x: fmt(x, '.0f') + ('%' if x is not None else '')
    cols += [fmt(ratio, '.2f') + ('x' if ratio is not None else ''), fmt(r.get('bandwidth_gbps')), fmt(roof),
             pct_txt(r.get('kvslim_pct_roofline', {}).get('full')),
             pct_txt(r.get('kvslim_pct_run_max_roofline', {}).get('full')), pct_txt(r.get('llama_best_pct_roofline'))]
    print('| ' + ' | '.join(cols) + ' |')

deep = [r for r in results if '@' in r['row']]
if deep:
    print()
    hdr = ['type', 'threads', 'depth', 'kvslim policy', 'decode tok/s', 'vs llama.cpp best full-cache',
           'kvslim KV bytes', 'llama.cpp F16 KV bytes', 'ratio', 'roofline tok/s', '% of roofline']
    print('| ' + ' | '.join(hdr) + ' |')
    print('|---' * len(hdr) + '|')
    for r in deep:
        for c in ('full', 'exact', 'snapkv', 'nacl', 'streaming'):
            if c not in r['kvslim_tok_s']:
                continue
            kvb, lb = r['kvslim_kv_bytes'][c], r['llama_f16_kv_bytes']
            vs = r['kvslim_vs_llama_best'].get(c)
            roofc = r['roofline'].get('full' if c in ('full', 'exact') else c, {}).get('tok_s')
            pct = r['kvslim_pct_roofline'].get(c)
            print(f"| {r['type']} | {r['threads']} | {r['row'].split('@')[1]} | {c} | {fmt(r['kvslim_tok_s'][c])} | "
                  f"{fmt(vs, '.2f')}{'x' if vs is not None else ''} | {kvb:.0f} | {lb} | "
                  f"{'1/' + format(lb / kvb, '.1f' if lb / kvb >= 2 else '.2f') if kvb else '—'} | {fmt(roofc)} | {fmt(pct, '.0f')}{'%' if pct is not None else ''} |")

cpu = next((l.split(':', 1)[1].strip() for l in open('/proc/cpuinfo') if l.startswith('model name')), '?')
bw_txt = ', '.join(f'{t} thread{"s" if t > 1 else ""} {bw[t]:.1f} GB/s ({bw_how[t]})' for t in sorted(bw))
cell_txt = ', '.join(f'{typ} t={t} {g:.1f}' for (typ, t), g in bw_cell.items())
nr = max((r['rounds'] for r in results), default=0)
print(f"\nllama.cpp: {peer}; commit {commit}; build flags: {flags}; CPU: {cpu}; "
      f"read bandwidth, max over the run: {bw_txt}; per type and thread count (the rooflines): "
      f"{cell_txt or 'not recorded'} GB/s; medians of {nr} round{'s' if nr != 1 else ''}; "
      f"weights streamed per token: GGUF tensor sizes, all but token_embd.weight")

# --- acceptance: the issue's targets ---
checks = []
def check(name, ok, num):
    checks.append({'target': name, 'pass': ok, 'value': num})
for r in results:
    tag = f"{r['type']} t={r['threads']} {r['row']}"
    ratio = r['kvslim_vs_llama_best'].get('full')
    if r['row'].startswith('tg') and '@' not in r['row'] and r['type'] in ('f32', 'q8_0'):
        check(f'{tag}: kvslim full >= 1.1x llama.cpp best', ratio is not None and ratio >= 1.1, ratio and f'{ratio:.2f}x')
    else:
        check(f'{tag}: kvslim full >= 1.0x llama.cpp best', ratio is not None and ratio >= 1.0, ratio and f'{ratio:.2f}x')
    if r['row'].startswith('tg'):
        pct, strict = r['kvslim_pct_roofline'].get('full'), r['kvslim_pct_run_max_roofline'].get('full')
        check(f'{tag}: kvslim full >= 85% of roofline', pct is not None and pct >= 85,
              pct and f"{pct:.0f}% ({strict:.0f}% of the run's highest bandwidth)")
    if '@' in r['row'] and int(r['row'].split('@')[1]) in (8192, 16384):
        for c in ('snapkv', 'nacl', 'streaming'):
            vs = r['kvslim_vs_llama_best'].get(c)
            check(f'{tag} {c}: decode >= 3x llama.cpp best full-cache', vs is not None and vs >= 3, vs and f'{vs:.2f}x')
            kvb = r['kvslim_kv_bytes'].get(c)
            frac = kvb / r['llama_f16_kv_bytes'] if kvb is not None else None
            check(f'{tag} {c}: KV bytes <= 1/8 of llama.cpp F16', frac is not None and frac <= 1 / 8,
                  frac and f'1/{1 / frac:.1f}')
present = {(r['type'], r['row']) for r in results}
for typ in ('f32', 'q8_0'):
    if not any(t == typ and row.startswith('tg') and '@' not in row for t, row in present):
        checks.append({'target': f'{typ} tg: kvslim full >= 1.1x llama.cpp best', 'pass': None, 'value': 'not run'})
for d in (8192, 16384):
    if not any(row.endswith(f'@{d}') for _, row in present):
        checks.append({'target': f'depth {d}: compressed rows >= 3x, KV <= 1/8', 'pass': None, 'value': 'not run'})
print('\nacceptance (the issue\'s targets):')
for c in checks:
    verdict = 'NOT RUN' if c['pass'] is None else ('PASS' if c['pass'] else 'MISS')
    print(f"  {verdict:7} {c['target']}: {c['value'] if c['value'] is not None else 'no data'}")
n_pass = sum(1 for c in checks if c['pass'])
n_miss = sum(1 for c in checks if c['pass'] is False)
print(f'  {n_pass} PASS, {n_miss} MISS, {len(checks) - n_pass - n_miss} not run')

json.dump({'peer': peer, 'peer_commit': commit, 'peer_build_flags': flags, 'cpu': cpu,
           'shape': env['SHAPE'], 'ctx': int(env['CTX']), 'models': shape,
           'bandwidth_gbps': {str(t): {'gbps': bw[t], 'strategy': bw_how[t]} for t in bw},
           'bandwidth_gbps_by_type': {f'{typ} t={t}': g for (typ, t), g in bw_cell.items()},
           'rounds': nr, 'rows': results, 'acceptance': checks},
          open(os.path.join(out, 'native.json'), 'w'), indent=1)
PY
