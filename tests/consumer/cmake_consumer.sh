#!/usr/bin/env bash
# Installs this build into a staging prefix, as `meson install` installs it
# for a user, then builds examples/cmake_consumer against it with CMake
# (find_package(Crucible)) and runs it; also builds a program with the
# installed pkg-config files' flags.
#   cmake_consumer.sh BUILD_DIR SOURCE_ROOT WORK_DIR
set -euo pipefail
build=$1 src=$2 work=$3
# 77: meson's "skipped", where cmake is not installed (./x installs it).
command -v cmake >/dev/null || { echo "skipped: cmake is not installed"; exit 77; }
rm -rf "$work"
mkdir -p "$work"
meson install -C "$build" --no-rebuild --quiet --destdir "$work/stage"
option() { meson introspect "$build" --buildoptions |
           python3 -c "import json, sys; print(next(o['value'] for o in json.load(sys.stdin) if o['name'] == '$1'))"; }
prefix=$work/stage$(option prefix)
libdir=$prefix/$(option libdir)

# pkg-config: a program built with its flags alone links the builder, whose
# default backend is then the interpreter (no backend library linked).
cat >"$work/pkg_config.cpp" <<'CPP'
#include <crucible/pipeline/builder.h>
int main() { return crucible::pipeline::Builder().backend_name() == "interpreter" ? 0 : 1; }
CPP
# shellcheck disable=SC2046
c++ -std=c++20 "$work/pkg_config.cpp" -o "$work/pkg_config" \
  $(PKG_CONFIG_PATH=$libdir/pkgconfig pkg-config --cflags --libs crucible-pipeline)
LD_LIBRARY_PATH=$libdir "$work/pkg_config"

# --as-needed, Ubuntu's default and not Debian's: the inductor must stay
# linked where the program names none of its symbols.
cmake -S "$src/examples/cmake_consumer" -B "$work/build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_EXE_LINKER_FLAGS=-Wl,--as-needed
cmake --build "$work/build" -j 2
"$work/build/cmake_consumer"
