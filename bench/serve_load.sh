#!/usr/bin/env bash
# Load and soak of `kvslim serve` on the loopback (never run by ctest; nothing is asserted).
# Load: wrk (bench/serve_load.lua) at 16, 32 and 64 connections, a fixed number of completions
# of MAX_TOKENS tokens each: throughput (requests/s, generated tok/s), p50/p99 latency, responses
# by status (anything but 200 is an error, bar 503 when the queue is full), the server's RSS.
# Soak: SOAK malformed requests (bad JSON, wrong types, empty and oversized bodies, bad kv, bad
# paths and methods) interleaved with valid ones, 4 clients at once: every response must be
# JSON with the expected status, the server alive after it, RSS before and after.
# Prints a table; writes BUILD_DIR/bench/serve/load.json.
#   bench/serve_load.sh [BUILD_DIR]   (env: MODEL stories260K-f32, PARALLEL 2, QUEUE 64,
#                                      REQUESTS 512 per level, MAX_TOKENS 16, KV "", SOAK 1000)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$here/build}" && pwd)
kvslim=$build/kvslim
model=${MODEL:-$here/../shared/models/gguf/stories260K-f32.gguf}
parallel=${PARALLEL:-2} queue=${QUEUE:-64} requests=${REQUESTS:-512} max_tokens=${MAX_TOKENS:-16}
kv=${KV:-} soak=${SOAK:-1000}
out=$build/bench/serve
mkdir -p "$out"
command -v wrk >/dev/null || { echo "serve_load: wrk is not installed (Debian: wrk)" >&2; exit 1; }

log=$out/server.log
"$kvslim" serve -m "$model" --host 127.0.0.1 --port 0 --parallel "$parallel" --queue "$queue" 2>"$log" &
pid=$!
trap 'kill -KILL $pid 2>/dev/null || true' EXIT
url=""
for _ in $(seq 300); do
  url=$(grep -m 1 -o 'listening on http://[^ ]*' "$log" | sed 's/listening on //' || true)
  [ -n "$url" ] && [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/health" || true)" = 200 ] && break
  kill -0 "$pid" 2>/dev/null || { echo "serve_load: the server died: $(tail -n 5 "$log")" >&2; exit 1; }
  sleep 0.1
done
case $url in http://127.0.0.1:*) ;; *) echo "serve_load: no loopback server ($url)" >&2; exit 1 ;; esac
rss() { awk '/^VmRSS/ { print $2 * 1024 }' "/proc/$pid/status"; }
hwm() { awk '/^VmHWM/ { print $2 * 1024 }' "/proc/$pid/status"; }
body="{\"prompt\":\"Once upon a time\",\"max_tokens\":$max_tokens,\"temperature\":0.8${kv:+,\"kv\":\"$kv\"}}"
echo "kvslim serve $url: $(basename "$model"), --parallel $parallel --queue $queue; $requests completions" \
  "of $max_tokens tokens per level${kv:+, kv $kv}; $(nproc) cores"

results=$out/levels.jsonl
: >"$results"
for c in 16 32 64; do
  rss0=$(rss)
  # One wrk thread (it keeps C connections busy): it stops after REQUESTS responses; 120 s is
  # only a bound.
  wrk -t 1 -c "$c" -d 120s --timeout 60s --script "$here/bench/serve_load.lua" "$url" \
    -- "$requests" "$body" >"$out/wrk-$c.txt" 2>&1 || true
  line=$(grep '^RESULT ' "$out/wrk-$c.txt" | sed 's/^RESULT //')
  [ -n "$line" ] || { echo "wrk at $c connections printed no result:"; cat "$out/wrk-$c.txt"; exit 1; }
  echo "{\"connections\":$c,\"rss_before\":$rss0,\"rss_after\":$(rss),\"wrk\":$line}" >>"$results"
done

# The soak.
rss_soak0=$(rss)
python3 - "$url" "$soak" >"$out/soak.json" <<'PY'
import http.client, json, random, sys, threading, time, urllib.parse
url, n_bad = sys.argv[1], int(sys.argv[2])
host, port = urllib.parse.urlsplit(url).hostname, urllib.parse.urlsplit(url).port
E = "invalid_request_error"
J = lambda o: json.dumps(o).encode()
bad = [  # (what, method, path, body bytes, status, error type)
    ("truncated JSON", "POST", "/v1/completions", b'{"prompt": "Once", "max_tokens": 4,', 400, E),
    ("trailing garbage", "POST", "/v1/completions", b'{"prompt":"Once"}}', 400, E),
    ("not JSON", "POST", "/v1/completions", b"prompt=Once&max_tokens=4", 400, E),
    ("binary", "POST", "/v1/completions", bytes(range(256)), 400, E),
    ("nested 100000 deep", "POST", "/v1/completions", b"[" * 100000 + b"]" * 100000, 400, E),
    ("a JSON string", "POST", "/v1/completions", b'"Once"', 400, E),
    ("empty body", "POST", "/v1/completions", b"", 400, E),
    ("empty chat body", "POST", "/v1/chat/completions", b"", 400, E),
    ("max_tokens a string", "POST", "/v1/completions", J({"prompt": "Once", "max_tokens": "4"}), 400, E),
    ("prompt a number", "POST", "/v1/completions", J({"prompt": 5}), 400, E),
    ("prompt an object", "POST", "/v1/completions", J({"prompt": {"a": 1}}), 400, E),
    ("temperature a list", "POST", "/v1/completions", J({"prompt": "Once", "temperature": [1]}), 400, E),
    ("stream a string", "POST", "/v1/completions", J({"prompt": "Once", "stream": "yes"}), 400, E),
    ("five stop strings", "POST", "/v1/completions", J({"prompt": "Once", "stop": ["a", "b", "c", "d", "e"]}), 400, E),
    ("stop a number", "POST", "/v1/completions", J({"prompt": "Once", "stop": 7}), 400, E),
    ("messages a string", "POST", "/v1/chat/completions", J({"messages": "hi"}), 400, E),
    ("messages of numbers", "POST", "/v1/chat/completions", J({"messages": [1, 2]}), 400, E),
    ("n=3", "POST", "/v1/completions", J({"prompt": "Once", "n": 3}), 400, E),
    ("max_tokens 0", "POST", "/v1/completions", J({"prompt": "Once", "max_tokens": 0}), 400, E),
    ("max_tokens 1e30", "POST", "/v1/completions", J({"prompt": "Once", "max_tokens": 1e30}), 400, E),
    ("bad kv policy", "POST", "/v1/completions", J({"prompt": "Once", "kv": "bogus:budget=0.5"}), 400, E),
    ("kv budget 7", "POST", "/v1/completions", J({"prompt": "Once", "kv": "snapkv:budget=7"}), 400, E),
    ("kv budget without a point", "POST", "/v1/completions", J({"prompt": "Once", "kv": "snapkv:budget=5"}), 400, E),
    ("kv unknown key", "POST", "/v1/completions", J({"prompt": "Once", "kv": "nacl:nosuchkey=1"}), 400, E),
    ("kv 10 kB", "POST", "/v1/completions", J({"prompt": "Once", "kv": "x" * 10000}), 400, E),
    ("bad kv_type", "POST", "/v1/completions", J({"prompt": "Once", "kv_type": "f3"}), 400, E),
    ("body of 2 MiB", "POST", "/v1/completions", b'{"prompt":"' + b"a" * (2 << 20) + b'"}', 413, E),
    ("unknown path", "POST", "/v1/embeddings", J({"input": "x"}), 404, E),
    ("wrong method", "GET", "/v1/completions", b"", 405, E),
    ("detokenize a string", "POST", "/detokenize", J({"tokens": "abc"}), 400, E),
    ("tokenize no content", "POST", "/tokenize", J({}), 400, E),
]
good = ("valid completion", "POST", "/v1/completions",
        J({"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}), 200, None)
plan = [bad[i % len(bad)] for i in range(n_bad)]
random.Random(1).shuffle(plan)
for i in range(len(plan), 0, -10):  # one valid request after every 10 malformed ones
    plan.insert(i, good)
lock = threading.Lock()
stats = {"requests": 0, "ok": 0, "wrong": [], "by_status": {}, "resets": 0}
lat = {}

def one(case):
    what, method, path, body, want, etype = case
    t0 = time.perf_counter()
    c = http.client.HTTPConnection(host, port, timeout=30)
    try:
        headers = {"Content-Type": "application/json"} if body else {}
        try:
            c.request(method, path, body=body if body or method == "POST" else None, headers=headers)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may answer a body over the limit before reading it all
        r = c.getresponse()
        data, status = r.read(), r.status
        ctype = r.getheader("Content-Type", "")
    except (ConnectionResetError, BrokenPipeError, http.client.RemoteDisconnected) as e:
        with lock:
            stats["requests"] += 1; stats["resets"] += 1
            stats["wrong"].append(f"{what}: connection closed without a response ({type(e).__name__})")
        return
    finally:
        c.close()
    ms = (time.perf_counter() - t0) * 1000
    problem = None
    try:
        doc = json.loads(data)
    except ValueError:
        problem = f"not JSON: {data[:80]!r}"
    else:
        if status != want:
            problem = f"status {status}, expected {want}: {data[:120]!r}"
        elif "application/json" not in ctype:
            problem = f"Content-Type {ctype}"
        elif etype and not (isinstance(doc.get("error"), dict) and doc["error"].get("type") == etype
                            and isinstance(doc["error"].get("message"), str)):
            problem = f"not an error of type {etype}: {data[:120]!r}"
        elif not etype and not doc.get("choices"):
            problem = f"no choices: {data[:120]!r}"
    with lock:
        stats["requests"] += 1
        stats["by_status"][str(status)] = stats["by_status"].get(str(status), 0) + 1
        lat.setdefault(what, []).append(ms)
        if problem:
            stats["wrong"].append(f"{what}: {problem}")
        else:
            stats["ok"] += 1

def worker(k):
    for case in plan[k::4]:
        one(case)

t0 = time.perf_counter()
ts = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
for t in ts: t.start()
for t in ts: t.join()
stats["seconds"] = round(time.perf_counter() - t0, 2)
stats["malformed"] = n_bad
stats["valid"] = len(plan) - n_bad
stats["wrong_examples"] = sorted(set(stats.pop("wrong")))[:20]
stats["wrong"] = stats["requests"] - stats["ok"]
stats["p50_ms_by_case"] = {k: round(sorted(v)[len(v) // 2], 2) for k, v in sorted(lat.items())}
c = http.client.HTTPConnection(host, port, timeout=10)
c.request("GET", "/health"); r = c.getresponse(); r.read()
stats["health_after"] = r.status
print(json.dumps(stats))
PY
rss_soak1=$(rss)
peak=$(hwm)
kill -TERM "$pid"
status=0
wait "$pid" || status=$?
trap - EXIT

python3 - "$results" "$out/soak.json" "$out/load.json" "$rss_soak0" "$rss_soak1" "$peak" "$status" \
  "$parallel" "$queue" "$requests" "$max_tokens" "$kv" "$(basename "$model")" <<'PY'
import json, sys
res, soakf, outf = sys.argv[1:4]
rss0, rss1, peak, status = (int(x) for x in sys.argv[4:8])
parallel, queue, requests, max_tokens = (int(x) for x in sys.argv[8:12])
kv, model = sys.argv[12], sys.argv[13]
mib = lambda b: f"{b / 2**20:.1f} MiB"
levels = []
print()
print("| connections | requests | req/s | generated tok/s | p50 ms | p99 ms | responses by status | socket errors | RSS before -> after |")
print("|---|---|---|---|---|---|---|---|---|")
for line in open(res):
    r = json.loads(line); w = r["wrk"]
    secs = w["seconds"]
    ok = w["status"].get("200", 0)
    errors = {k: v for k, v in w["status"].items() if k not in ("200", "503")}
    lv = {"connections": r["connections"], "responses": w["responses"], "status": w["status"],
          "errors": sum(errors.values()) + sum(w["socket_errors"].values()),
          "socket_errors": w["socket_errors"], "seconds": round(secs, 3),
          "req_per_s": round(ok / secs, 1), "generated_tok_per_s": round(w["tokens"] / secs, 1),
          "p50_ms": w["latency_us"]["p50"] / 1000, "p99_ms": w["latency_us"]["p99"] / 1000,
          "rss_before": r["rss_before"], "rss_after": r["rss_after"]}
    levels.append(lv)
    st = ", ".join(f"{k}: {v}" for k, v in sorted(w["status"].items()))
    se = sum(w["socket_errors"].values())
    print(f"| {lv['connections']} | {w['responses']} | {lv['req_per_s']} | {lv['generated_tok_per_s']} | "
          f"{lv['p50_ms']:.1f} | {lv['p99_ms']:.1f} | {st} | {se} | {mib(lv['rss_before'])} -> {mib(lv['rss_after'])} |")
soak = json.load(open(soakf))
soak.update({"rss_before": rss0, "rss_after": rss1})
print()
print(f"soak: {soak['malformed']} malformed + {soak['valid']} valid requests, 4 clients, {soak['seconds']} s: "
      f"{soak['ok']} answered as expected, {soak['wrong']} not; by status {soak['by_status']}; "
      f"/health after: {soak['health_after']}; RSS {mib(rss0)} -> {mib(rss1)} (peak {mib(peak)})")
for w in soak["wrong_examples"]:
    print(f"  unexpected: {w}")
print(f"server exit status after SIGTERM: {status}")
doc = {"model": model, "parallel": parallel, "queue": queue, "requests_per_level": requests,
       "max_tokens": max_tokens, "kv": kv or None, "levels": levels, "soak": soak,
       "rss_peak": peak, "exit_status": status}
json.dump(doc, open(outf, "w"), indent=1)
print(f"wrote {outf}")
PY
