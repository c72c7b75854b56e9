#!/usr/bin/env bash
# Installs the node clients of the serve tests (tests/serve/package.json: the official openai
# client and puppeteer-core) into $KVS_BUILD_DIR/serve-node, and copies the tests' .mjs scripts
# beside them (an ES module finds its packages from its own folder). Nothing is written into the
# source tree. Idempotent, and safe when several tests run it at once (flock on a lock file in
# that folder): npm ci runs only when package-lock.json changed. Prints nothing on success.
#   tests/serve/setup.sh            (env: KVS_BUILD_DIR, as ctest sets it)
set -euo pipefail
: "${KVS_BUILD_DIR:?run through ctest (KVS_BUILD_DIR unset)}"
src=$(cd "$(dirname "$0")" && pwd)
dir=$KVS_BUILD_DIR/serve-node
mkdir -p "$dir"
for tool in node npm; do
  command -v "$tool" >/dev/null || { echo "serve setup: '$tool' is not installed (Debian: nodejs, npm)" >&2; exit 1; }
done
exec 9>"$dir/.lock"
flock -w 300 9 || { echo "serve setup: timed out waiting for $dir/.lock" >&2; exit 1; }
if ! cmp -s "$src/package-lock.json" "$dir/.installed-lock" || [ ! -d "$dir/node_modules/openai" ] \
   || [ ! -d "$dir/node_modules/puppeteer-core" ]; then
  cp "$src/package.json" "$src/package-lock.json" "$dir/"
  rm -f "$dir/.installed-lock"
  # puppeteer-core never downloads a browser; the variable is belt and braces.
  if ! (cd "$dir" && PUPPETEER_SKIP_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error \
        >"$dir/npm.log" 2>&1); then
    echo "serve setup: 'npm ci' failed in $dir (the npm registry unreachable?); its log:" >&2
    tail -n 20 "$dir/npm.log" >&2
    exit 1
  fi
  cp "$src/package-lock.json" "$dir/.installed-lock"
fi
# The scripts: written to a temporary name, then renamed, so a test running one never sees it
# half written.
for f in "$src"/*.mjs; do
  [ -e "$f" ] || continue
  if ! cmp -s "$f" "$dir/$(basename "$f")"; then
    cp "$f" "$dir/.$(basename "$f").tmp" && mv -f "$dir/.$(basename "$f").tmp" "$dir/$(basename "$f")"
  fi
done
