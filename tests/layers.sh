#!/usr/bin/env bash
# The layering of DESIGN.md, checked on every #include "..." line: a file in src/LAYER may
# include its own layer, the layers below it and the public kvslim.h; the tools (tools/,
# examples/) only kvslim.h, the internal tools API kvslim_tools.h and their own headers.
# Usage: tests/layers.sh [ROOT] (default: the checkout this script is in).
set -euo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
# Rank of each layer: a file may include ranks strictly below its own, or its own folder.
declare -A rank=([core]=0 [gguf]=1 [tokenizer]=2 [kv]=2 [policies]=3 [model]=3 [engine]=4
                 [eval]=5 [mpc]=6 [server]=6)
bad=0 checked=0
violation() { echo "layers: $1"; bad=$((bad + 1)); }
while IFS= read -r file; do
  rel=${file#"$root"/}
  case $rel in
    src/kvslim_tools.h) continue ;; # the documented gate: may include any layer
    src/*/*) layer=${rel#src/}; layer=${layer%%/*} ;;
    tools/*|examples/*) layer=tools ;;
    *) continue ;;
  esac
  if [ "$layer" != tools ] && [ -z "${rank[$layer]+x}" ]; then
    violation "$rel: folder src/$layer has no rank in tests/layers.sh (add it where DESIGN.md puts it)"
    continue
  fi
  while IFS=: read -r line inc; do
    checked=$((checked + 1))
    target=${inc%%/*}
    [ "$inc" = kvslim.h ] && continue
    if [ "$layer" = tools ]; then
      case $inc in kvslim_tools.h|cli*.h) continue ;; esac
      violation "$rel:$line includes \"$inc\": tools use kvslim.h or kvslim_tools.h"
      continue
    fi
    [ "$target" = "$inc" ] && continue   # a header of the same folder, without a path
    [ "$target" = "$layer" ] && continue
    if [ -z "${rank[$target]+x}" ]; then
      violation "$rel:$line includes \"$inc\": unknown layer '$target'"
    elif [ "${rank[$target]}" -ge "${rank[$layer]}" ]; then
      violation "$rel:$line includes \"$inc\": $layer (rank ${rank[$layer]}) may not include $target (rank ${rank[$target]})"
    fi
  done < <(grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$file" \
             | sed -E 's/^([0-9]+):[[:space:]]*#[[:space:]]*include[[:space:]]*"([^"]*)".*/\1:\2/')
done < <(find "$root/src" "$root/tools" "$root/examples" -name '*.[ch]' 2>/dev/null | sort)
echo "layers: $checked includes checked, $bad crossing a layer upward"
[ "$checked" -gt 0 ] && [ "$bad" -eq 0 ]
