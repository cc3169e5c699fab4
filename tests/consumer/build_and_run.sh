#!/usr/bin/env bash
# Builds examples/consumer as a user would, with this source tree as its
# subprojects/crucible, then runs it.
#   build_and_run.sh SOURCE_ROOT WORK_DIR TORCH_PREFIX [EXTRA_PREFIX]
set -euo pipefail
src=$1 work=$2 torch=$3 extra=${4:-}
mkdir -p "$work/project/subprojects"
cp "$src/examples/consumer/meson.build" "$src/examples/consumer/main.cpp" "$work/project/"
ln -sfn "$src" "$work/project/subprojects/crucible"
# Crucible's sources compile as unity blocks here (meson's unity=subprojects):
# the main build compiles each file alone already, and this build's job is
# the subproject's wiring, which unity keeps; it halves this build's time
# (6.4 to 3.6 min on the 2-core VM).
args=("-Dcrucible:torch_prefix=$torch" -Dunity=subprojects)
[ -n "$extra" ] && args+=("-Dcrucible:extra_prefix=$extra")
if [ -f "$work/build/build.ninja" ]; then
  meson configure "$work/build" "${args[@]}" >/dev/null
else
  meson setup "$work/build" "$work/project" "${args[@]}"
fi
# Only the consumer and what it links (the builder and the libraries under
# it), not the zoo, the data sets or the CLI.
ninja -C "$work/build" consumer
# The builder links no backend library: no inductor, no NVRTC.
if ldd "$work/build/consumer" | grep -E 'crucible_inductor|nvrtc'; then
  echo "the consumer of crucible-pipeline links the above" >&2
  exit 1
fi
"$work/build/consumer"
