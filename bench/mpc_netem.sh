#!/usr/bin/env bash
# The two-party engine under real network emulation, beside its own cost model. The cost table's
# "LAN s (model)" is rounds x RTT + wire bytes / bandwidth with a 0.3 ms RTT and 377 MB/s, for
# the party link only (party 0 <-> party 1; the dealer's traffic is offline, not in the model).
# This script builds that link: three network namespaces (party 0, party 1, the dealer), a veth
# pair between the parties with `netem delay 0.15ms rate 3016mbit` on BOTH ends (0.3 ms RTT,
# 377 MB/s each way), and one veth pair from the dealer to each party WITHOUT netem. It runs the
# three standalone roles (`kvslim mpc dealer`, `mpc party --role 1`, `mpc party --role 0 --json`)
# via `ip netns exec`, fresh keys from `openssl rand -hex 32` per run, on the prompt
# "Once upon a time", first with the party link's qdisc removed (the baseline: same namespaces,
# same veths, no emulation), then with netem, alternating baseline/netem in ABBA order for
# PAIRS pairs. From party 0's JSON it prints, per decoded token, the median wall time without
# and with netem, their difference (what the network added), the model's LAN prediction
# (lan_s_per_token) and the ratio added / modelled. It also measures the link's RTT with
# `ping -c 20` inside party 0's namespace (or, without ping, a 20-probe UDP echo in python3).
# Kernels without sch_netem (CONFIG_NET_SCH_NETEM unset, e.g. minimal Firecracker guests: tc
# says "Specified qdisc kind is unknown") get the same link from a userspace emulator instead:
# a tun device in each party's namespace and a small C forwarder (bench/tools/netemu.c, compiled
# into the run's temporary directory) that delays each IP packet by 0.15 ms after serialising it at
# 377 MB/s, per direction; the baseline is the same forwarder with no delay and no rate limit,
# so the difference is again what the emulated network added. The output says which was used.
#   bench/mpc_netem.sh [-m MODEL] [-n N] [--insecure-plain] [--pairs P] [--emulator E] [OUT_JSON]
#     -m MODEL          the model party 1 serves (default <shared>/models/gguf/stories260K-f32.gguf)
#     -n N              tokens to generate (default 16)
#     --insecure-plain  plain channels on every link (default: AES-256-GCM, the real setting)
#     --pairs P         baseline/netem pairs, ABBA order (default 2); the medians are reported
#     --emulator E      auto (default: netem if the kernel has it, else tun), netem or tun
#     OUT_JSON          the results as JSON (default <repo>/build/mpc_netem.json)
# Env: KVSLIM (default <repo>/build/kvslim; copied to a private directory first, so a rebuild
#      during the run does not change it), TIMEOUT (each role's --timeout, default 120).
# Needs root and `ip netns` (exit 2 otherwise); every namespace, veth and process it starts is
# removed on exit, failure or Ctrl-C. Names carry the script's pid, so parallel runs do not clash.
# Output: a markdown table on stdout, progress on stderr, OUT_JSON. A benchmark, not a test.
set -euo pipefail
if [ -n "${CI:-}" ]; then
  echo "mpc_netem.sh: not run in CI (benchmark)" >&2
  exit 0
fi
here=$(cd "$(dirname "$0")/.." && pwd)
shared=$(cd "$here/../shared" && pwd)
model=$shared/models/gguf/stories260K-f32.gguf
n=16
plain=0
pairs=2
emulator=auto
out_json=$here/build/mpc_netem.json
usage() { sed -n '22,28p' "$0" | sed 's/^# \{0,1\}//' >&2; exit "${1:-2}"; }
while [ $# -gt 0 ]; do
  case $1 in
    -m|--model) model=$2; shift 2 ;;
    -n|--n-predict) n=$2; shift 2 ;;
    --insecure-plain) plain=1; shift ;;
    --pairs) pairs=$2; shift 2 ;;
    --emulator) emulator=$2; shift 2 ;;
    -h|--help) usage 0 ;;
    -*) echo "mpc_netem: unknown option $1" >&2; usage 2 ;;
    *) out_json=$1; shift ;;
  esac
done
[[ $n =~ ^[1-9][0-9]*$ ]] || { echo "mpc_netem: -n must be a positive integer, got '$n'" >&2; exit 2; }
[[ $pairs =~ ^[1-9][0-9]*$ ]] || { echo "mpc_netem: --pairs must be a positive integer, got '$pairs'" >&2; exit 2; }
case $emulator in auto|netem|tun) ;; *) echo "mpc_netem: --emulator auto|netem|tun, got '$emulator'" >&2; exit 2 ;; esac
[ -f "$model" ] || { echo "mpc_netem: no model file $model" >&2; exit 2; }
timeout_s=${TIMEOUT:-120}
prompt="Once upon a time"
tc=/usr/sbin/tc
[ -x "$tc" ] || tc=$(command -v tc || true)

if [ "$(id -u)" != 0 ]; then
  echo "mpc_netem: needs root (network namespaces, veth pairs and tc netem); run it as root" >&2
  exit 2
fi
[ -n "$tc" ] && [ -x "$tc" ] || { echo "mpc_netem: tc not found (/usr/sbin/tc)" >&2; exit 2; }
command -v openssl >/dev/null || { echo "mpc_netem: openssl not found (keys)" >&2; exit 2; }

# Unique per run: the pid (6 hex digits) in every name; veth names stay within 15 characters.
id=$(printf '%06x' $$)
ns0=kvslim-netem-$id-p0
ns1=kvslim-netem-$id-p1
nsd=kvslim-netem-$id-dealer
v01a=kn${id}pa v01b=kn${id}pb   # party 0 <-> party 1 (netem on both ends; or the tun pair)
vd0a=kn${id}0d vd0b=kn${id}0p   # dealer <-> party 0 (no netem)
vd1a=kn${id}1d vd1b=kn${id}1p   # dealer <-> party 1 (no netem)
ip0=10.77.0.1 ip1=10.77.0.2     # party link, 10.77.0.0/30
ipd0=10.77.0.5 ipp0=10.77.0.6   # dealer - party 0, 10.77.0.4/30
ipd1=10.77.0.9 ipp1=10.77.0.10  # dealer - party 1, 10.77.0.8/30
dealer_port=7100 party_port=7101

tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpc_netem.$id.XXXXXX")
created_ns=()
pids=()
fwd_pid=
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  if [ -n "$fwd_pid" ]; then kill "$fwd_pid" 2>/dev/null || true; wait "$fwd_pid" 2>/dev/null || true; fi
  local ns
  # Deleting a namespace deletes the veth ends inside it (and so their peers).
  for ns in "${created_ns[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
  rm -rf "$tmp"
  [ "${#created_ns[@]}" -gt 0 ] && echo "mpc_netem: removed namespaces ${created_ns[*]}" >&2
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

kvslim=$tmp/kvslim
cp "${KVSLIM:-$here/build/kvslim}" "$kvslim"

for ns in "$ns0" "$ns1" "$nsd"; do
  if ! ip netns add "$ns" 2>"$tmp/netns.err"; then
    echo "mpc_netem: \`ip netns add $ns\` failed: $(cat "$tmp/netns.err")" >&2
    exit 2
  fi
  created_ns+=("$ns")
  ip -n "$ns" link set lo up
done
ip link add "$vd0a" netns "$nsd" type veth peer name "$vd0b" netns "$ns0"
ip link add "$vd1a" netns "$nsd" type veth peer name "$vd1b" netns "$ns1"
ip -n "$nsd" addr add $ipd0/30 dev "$vd0a"
ip -n "$ns0" addr add $ipp0/30 dev "$vd0b"
ip -n "$nsd" addr add $ipd1/30 dev "$vd1a"
ip -n "$ns1" addr add $ipp1/30 dev "$vd1b"
for pair in "$nsd $vd0a" "$ns0 $vd0b" "$nsd $vd1a" "$ns1 $vd1b"; do
  set -- $pair
  ip -n "$1" link set "$2" up
done

if [ "$emulator" = auto ]; then
  # Probe for sch_netem on a scratch device of party 0's namespace.
  if ip netns exec "$ns0" "$tc" qdisc add dev lo root netem delay 0 2>/dev/null; then
    ip netns exec "$ns0" "$tc" qdisc del dev lo root 2>/dev/null || true
    emulator=netem
  else
    echo "mpc_netem: this kernel has no sch_netem (tc: qdisc kind unknown): using the userspace" \
      "tun emulator" >&2
    emulator=tun
  fi
fi
if [ "$emulator" = netem ]; then
  ip link add "$v01a" netns "$ns0" type veth peer name "$v01b" netns "$ns1"
  emu_on() {
    ip netns exec "$ns0" "$tc" qdisc replace dev "$v01a" root netem delay 0.15ms rate 3016mbit
    ip netns exec "$ns1" "$tc" qdisc replace dev "$v01b" root netem delay 0.15ms rate 3016mbit
  }
  emu_off() {
    ip netns exec "$ns0" "$tc" qdisc del dev "$v01a" root 2>/dev/null || true
    ip netns exec "$ns1" "$tc" qdisc del dev "$v01b" root 2>/dev/null || true
  }
  emu_desc() { ip netns exec "$ns0" "$tc" qdisc show dev "$v01a" | head -n 1; }
else
  cc=$(command -v cc || command -v gcc || command -v clang || true)
  [ -n "$cc" ] || { echo "mpc_netem: no sch_netem and no C compiler for the tun emulator" >&2; exit 2; }
  [ -c /dev/net/tun ] || { echo "mpc_netem: no sch_netem and no /dev/net/tun" >&2; exit 2; }
  # bench/tools/netemu.c: the tun forwarder (its header says how it is driven)
  if ! "$cc" -O2 -Wall -o "$tmp/netemu" "$here/bench/tools/netemu.c" 2>"$tmp/cc.err"; then
    echo "mpc_netem: cannot compile the tun emulator: $(cat "$tmp/cc.err")" >&2
    exit 2
  fi
  "$tmp/netemu" "$ns0" "$v01a" "$ns1" "$v01b" 150000 377000000 "$tmp/netemu.state" \
    2>"$tmp/netemu.log" &
  fwd_pid=$!
  for ((w = 0; w < 100; w++)); do
    [ -f "$tmp/netemu.state" ] && break
    kill -0 "$fwd_pid" 2>/dev/null || break
    sleep 0.05
  done
  [ -f "$tmp/netemu.state" ] || { echo "mpc_netem: the tun emulator did not start: $(cat "$tmp/netemu.log")" >&2; exit 2; }
  emu_set() { # SIGNAL STATE
    kill -"$1" "$fwd_pid"
    local w
    for ((w = 0; w < 100; w++)); do
      [ "$(cat "$tmp/netemu.state" 2>/dev/null)" = "$2" ] && return 0
      sleep 0.02
    done
    echo "mpc_netem: the tun emulator did not switch $2: $(cat "$tmp/netemu.log")" >&2
    exit 1
  }
  emu_on() { emu_set USR1 on; }
  emu_off() { emu_set USR2 off; }
  emu_desc() { echo "userspace tun emulator: delay 0.15ms rate 377MB/s each direction, MTU 1500"; }
fi
ip -n "$ns0" addr add $ip0/30 dev "$v01a"
ip -n "$ns1" addr add $ip1/30 dev "$v01b"
ip -n "$ns0" link set "$v01a" up
ip -n "$ns1" link set "$v01b" up
if ! emu_on 2>"$tmp/tc.err"; then
  echo "mpc_netem: tc netem failed: $(cat "$tmp/tc.err")" >&2
  exit 2
fi
echo "mpc_netem: namespaces $ns0, $ns1, $nsd; party link $ip0 <-> $ip1 with $(emu_desc)" >&2

# RTT of the party link, from party 0's namespace: "min avg max mdev" in ms, or nothing.
udp_echo_server='
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind((sys.argv[1], int(sys.argv[2])))
s.settimeout(30)
while True:
    d, a = s.recvfrom(2048)
    if d == b"quit": break
    s.sendto(d, a)
'
udp_echo_client='
import socket, statistics, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(1.0)
dst = (sys.argv[1], int(sys.argv[2])); rtts = []
for i in range(40):  # the first 20 warm up (and wait for the server); back to back

    t = time.perf_counter(); s.sendto(b"x" * 56, dst)
    try: s.recvfrom(2048)
    except socket.timeout: continue
    if i >= 20: rtts.append((time.perf_counter() - t) * 1e3)
s.sendto(b"quit", dst)
if rtts: print(min(rtts), statistics.mean(rtts), max(rtts), statistics.pstdev(rtts))
'
rtt_tool=
if command -v ping >/dev/null; then
  rtt_tool=ping
elif command -v python3 >/dev/null; then
  rtt_tool="udp echo (python3; ping not installed)"
fi
measure_rtt() {
  if [ "$rtt_tool" = ping ]; then
    ip netns exec "$ns0" ping -c 20 -i 0.05 -q "$ip1" 2>/dev/null \
      | sed -n 's|.*= \([0-9.]*\)/\([0-9.]*\)/\([0-9.]*\)/\([0-9.]*\) ms.*|\1 \2 \3 \4|p'
  elif [ -n "$rtt_tool" ]; then
    ip netns exec "$ns1" python3 -c "$udp_echo_server" "$ip1" 7200 &
    local sp=$!
    pids+=("$sp")
    ip netns exec "$ns0" python3 -c "$udp_echo_client" "$ip1" 7200 || true
    wait "$sp" 2>/dev/null || true
  fi
}
rtt_netem=$(measure_rtt)
emu_off
rtt_base=$(measure_rtt)
if [ -z "$rtt_tool" ]; then
  echo "mpc_netem: neither ping nor python3: RTT check skipped" >&2
fi

hash=$(sha256sum "$model" | cut -d' ' -f1)
flags=(--timeout "$timeout_s")
[ "$plain" = 1 ] && flags+=(--insecure-plain)
# run_once MODE(base|netem) IDX: one generation by the three standalone roles; party 0's JSON
# lands in $tmp/MODE-IDX.json.
run_once() {
  local mode=$1 i=$2 tag=$1-$2
  if [ "$mode" = netem ]; then emu_on; else emu_off; fi
  local keys=()
  if [ "$plain" = 0 ]; then
    local k
    for k in peer d0 d1; do
      (umask 077; openssl rand -hex 32 > "$tmp/$tag.$k.key")
    done
    keys=(--key0 "$tmp/$tag.d0.key" --key1 "$tmp/$tag.d1.key")
  fi
  echo "mpc_netem: run $tag ($([ "$mode" = netem ] && echo netem || echo no netem))" >&2
  local t0=$SECONDS
  ip netns exec "$nsd" "$kvslim" mpc dealer --listen $dealer_port "${keys[@]}" \
    --model-hash "$hash" "${flags[@]}" >"$tmp/$tag.dealer.log" 2>&1 &
  local dp=$!
  pids+=("$dp")
  keys=()
  [ "$plain" = 0 ] && keys=(--peer-key "$tmp/$tag.peer.key" --dealer-key "$tmp/$tag.d1.key")
  ip netns exec "$ns1" "$kvslim" mpc party --role 1 -m "$model" --listen $party_port \
    --dealer $ipd1:$dealer_port "${keys[@]}" "${flags[@]}" >"$tmp/$tag.p1.log" 2>&1 &
  local p1=$!
  pids+=("$p1")
  [ "$plain" = 0 ] && keys=(--peer-key "$tmp/$tag.peer.key" --dealer-key "$tmp/$tag.d0.key")
  local rc0=0 rc1=0 rcd=0
  ip netns exec "$ns0" "$kvslim" mpc party --role 0 -m "$model" -p "$prompt" -n "$n" \
    --peer $ip1:$party_port --dealer $ipd0:$dealer_port "${keys[@]}" "${flags[@]}" \
    --json "$tmp/$tag.json" >"$tmp/$tag.p0.log" 2>&1 || rc0=$?
  wait "$p1" || rc1=$?
  wait "$dp" || rcd=$?
  pids=()
  if [ $rc0 != 0 ] || [ $rc1 != 0 ] || [ $rcd != 0 ]; then
    echo "mpc_netem: run $tag failed (party 0: $rc0, party 1: $rc1, dealer: $rcd)" >&2
    local r
    for r in p0 p1 dealer; do
      echo "--- $r:" >&2
      tail -n 20 "$tmp/$tag.$r.log" >&2
    done
    exit 1
  fi
  echo "mpc_netem:   $((SECONDS - t0)) s, $(python3 -c 'import json,sys; print("%.4f s per decoded token" % json.load(open(sys.argv[1]))["wall_s_per_token"])' "$tmp/$tag.json")" >&2
}
runs=()
for ((p = 0; p < pairs; p++)); do
  if ((p % 2 == 0)); then order="base netem"; else order="netem base"; fi
  for mode in $order; do
    run_once "$mode" "$p"
    runs+=("$mode|$tmp/$mode-$p.json")
  done
done
emu_off
echo "mpc_netem: party 0's output of the first netem run:" >&2
sed 's/^/  /' "$tmp/netem-0.p0.log" >&2

mkdir -p "$(dirname "$out_json")"
python3 - "$out_json" "$plain" "$n" "$emulator" "$rtt_tool" "$rtt_netem" "$rtt_base" "${runs[@]}" <<'PY'
import json, statistics, sys
dst, plain, n, emulator, rtt_tool, rtt_netem, rtt_base = sys.argv[1:8]
plain = plain == "1"
def rtt(s):
    v = [float(x) for x in s.split()]
    return dict(zip(("min_ms", "avg_ms", "max_ms", "mdev_ms"), v)) if len(v) == 4 else None
rtt_netem, rtt_base = rtt(rtt_netem), rtt(rtt_base)
runs = {"base": [], "netem": []}
for arg in sys.argv[8:]:
    mode, f = arg.split("|", 1)
    runs[mode].append(json.load(open(f)))
keys = ("wall_s_per_token", "lan_s_per_token", "rounds_per_token", "messages_per_token",
        "online_wire_bytes_per_token", "online_bytes_per_token", "dealer_bytes_per_token")
def med(mode, k): return statistics.median(r[k] for r in runs[mode])
r0 = runs["netem"][0]
lan = r0["lan"]
base, netem = med("base", "wall_s_per_token"), med("netem", "wall_s_per_token")
added = netem - base
# Runs are paired (ABBA); each pair's difference cancels slow drifts of the machine's load.
paired = [x["wall_s_per_token"] - y["wall_s_per_token"] for x, y in zip(runs["netem"], runs["base"])]
model_s = med("netem", "lan_s_per_token")
rounds, msgs = med("netem", "rounds_per_token"), med("netem", "messages_per_token")
wire = med("netem", "online_wire_bytes_per_token")
lat_part, bw_part = rounds * lan["rtt_s"], wire / lan["bytes_per_s"]
# Most rounds are symmetric (both parties send, then both receive: gates.h "each sends its
# share; one round"), which costs one ONE-WAY delay on a real link, not an RTT.
oneway_s = rounds * lan["rtt_s"] / 2 + bw_part
ratio = added / model_s if model_s > 0 else float("nan")
res = {
    "model": r0["model"], "prompt": "Once upon a time", "n_predict": int(n),
    "decode_steps": r0["decode_steps"], "insecure_plain": plain, "channels": r0["channels"],
    "emulator": emulator,
    "netem": {"per_end": "delay 0.15ms rate 3016mbit", "rtt_s": 0.0003, "bytes_per_s": 377000000},
    "rtt_tool": rtt_tool or None, "rtt_netem": rtt_netem, "rtt_no_netem": rtt_base,
    "pairs": len(runs["netem"]),
    "wall_s_per_token_no_netem": base, "wall_s_per_token_netem": netem,
    "added_s_per_token": added, "lan_s_per_token_model": model_s,
    "model_rounds_x_rtt_s": lat_part, "model_bytes_over_bw_s": bw_part,
    "added_over_model": ratio, "model_one_way_per_round_s": oneway_s,
    "added_over_one_way_model": added / oneway_s if oneway_s > 0 else None, "rounds_per_token": rounds, "messages_per_token": msgs,
    "online_wire_bytes_per_token": wire,
    "added_s_per_token_paired": paired, "added_s_per_token_paired_median": statistics.median(paired),
    "added_s_per_round": added / rounds if rounds else None,
    "runs": {m: [{k: r[k] for k in keys} | {"decode_wall_s": r["decode"]["wall_s"],
                 "prefill_wall_s": r["prefill"]["wall_s"], "text": r["text"]} for r in rs]
             for m, rs in runs.items()},
}
json.dump(res, open(dst, "w"), indent=1)
ms = lambda s: f"{s * 1e3:.1f} ms"
print(f"two-party decode per token under netem: {res['model']}, {r0['channels']} channels, "
      f"\"Once upon a time\" -n {n} ({r0['decode_steps']} decode steps), "
      f"median of {res['pairs']} run(s) each")
print("party link emulated by " + ("tc netem delay 0.15ms rate 3016mbit on both veth ends"
      if emulator == "netem" else "the userspace tun emulator (no sch_netem in this kernel): "
      "0.15 ms + 377 MB/s each way") + "\n")
if rtt_netem:
    line = (f"party link RTT ({rtt_tool}, 20 probes): netem {rtt_netem['avg_ms']:.3f} ms avg "
            f"(min {rtt_netem['min_ms']:.3f}, max {rtt_netem['max_ms']:.3f})")
    if rtt_base:
        line += (f"; without netem {rtt_base['avg_ms']:.3f} ms avg "
                 f"(min {rtt_base['min_ms']:.3f})")
    print(line)
else:
    print("party link RTT: not measured (no ping, no python3)")
print()
print("| wall s, no netem | wall s, netem | added by network | LAN s (model) | added / model |")
print("|---|---|---|---|---|")
print(f"| {base:.4f} | {netem:.4f} | {added:.4f} | {model_s:.4f} | {ratio:.2f} |")
print()
print(f"model = {rounds:.1f} rounds x {lan['rtt_s'] * 1e3:.1f} ms ({ms(lat_part)}) + "
      f"{wire / 1024:.1f} KiB wire / {lan['bytes_per_s'] / 1e6:.0f} MB/s ({ms(bw_part)}); "
      f"{msgs:.1f} messages per token")
print(f"measured: the network added {added / rounds * 1e3:.3f} ms per round "
      f"(model: {model_s / rounds * 1e3:.3f} ms per round)")
print(f"the same with one one-way delay (RTT/2) per round: {ms(oneway_s)}; "
      f"added / that = {added / oneway_s:.2f}")
print("added per pair (netem - no netem, s per token): " + ", ".join(f"{d:.4f}" for d in paired)
      + f"; median {statistics.median(paired):.4f}, / model {statistics.median(paired) / model_s:.2f}")
print("samples (s per token): no netem " +
      ", ".join(f"{r['wall_s_per_token']:.4f}" for r in runs["base"]) + "; netem " +
      ", ".join(f"{r['wall_s_per_token']:.4f}" for r in runs["netem"]))
texts = {r["text"] for rs in runs.values() for r in rs}
if len(texts) != 1:
    print("WARNING: the runs generated different texts")
PY
echo "mpc_netem: wrote $out_json" >&2
