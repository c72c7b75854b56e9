#!/usr/bin/env bash
# Installs the Debian packages kvslim needs to build, test and plot, if any is missing; extra
# package names as arguments (make fuzz: clang, for libFuzzer) are installed the same way.
set -euo pipefail
# libmicrohttpd and cJSON: the server; chromium, curl: its tests (the page in a real browser,
# raw HTTP); wrk: its load benchmark; lcov: `make coverage`; cppcheck: `make lint`.
packages=(build-essential cmake pkg-config libopenblas-dev gnuplot-nox jq libssl-dev
  libmicrohttpd-dev libcjson-dev libpcre2-dev chromium curl wrk python3 lcov cppcheck "$@")
missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
# Node.js and npm run the server's client tests (the openai package, the browser driver). A
# machine that has them from elsewhere (e.g. NodeSource) keeps them: Debian's npm would conflict.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  missing+=(nodejs npm)
fi
# python3 may come from elsewhere too (pyenv): then Debian's is not needed.
if command -v python3 >/dev/null; then
  missing=("${missing[@]/python3}")
fi
read -r -a missing <<<"${missing[*]}"
[ ${#missing[@]} -eq 0 ] && exit 0
echo "setup: installing ${missing[*]}" >&2
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
