#!/usr/bin/env bash
# run.sh CRUCIBLE EXAMPLE: exports the MLP's training step with CRUCIBLE,
# trains it with EXAMPLE (another process), and checks that EXAMPLE links
# none of the compiler's libraries (Crucible's, or NVRTC).
set -euo pipefail
crucible=$1 example=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$crucible" export --model mlp --batch 16 --out "$dir/step"
"$example" "$dir/step" | tee "$dir/losses.txt"
[ "$(grep -c '^step [0-9]* loss ' "$dir/losses.txt")" = 10 ] || { echo "expected 10 losses"; exit 1; }
# The losses fall: the step trains.
awk 'NR == 1 { first = $4 } END { if (!($4 < first)) { print "loss did not fall: " first " -> " $4; exit 1 } }' \
  "$dir/losses.txt"
if ldd "$example" | grep -E 'libcrucible_(tracer|autograd|partitioner|pipeline|inductor)\.so|libnvrtc'; then
  echo "the example links a compiler library"; exit 1
fi
