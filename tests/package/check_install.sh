#!/usr/bin/env bash
# Installs the build in $1 into a fresh prefix under $2, then builds and runs a project outside
# the tree against it twice: through find_package(Ember) and through pkg-config.
set -euo pipefail
BUILD="$1"
WORK="$2"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
rm -rf "$WORK" && mkdir -p "$WORK"
cmake --install "$BUILD" --prefix "$WORK/prefix" > "$WORK/install.log"
for f in include/ember/ember.h include/ember/accelerate.h include/ember/version.h include/ember/core/tensor.h \
         lib/libember.so bin/ember lib/cmake/Ember/EmberConfig.cmake lib/pkgconfig/ember.pc; do
  [[ -e "$WORK/prefix/$f" ]] || { echo "missing after install: $f" >&2; exit 1; }
done
"$WORK/prefix/bin/ember" --version

# find_package(Ember)
cmake -S "$HERE/consumer" -B "$WORK/cmake-build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$WORK/prefix" > "$WORK/configure.log"
cmake --build "$WORK/cmake-build" > "$WORK/build.log"
LD_LIBRARY_PATH="$WORK/prefix/lib" "$WORK/cmake-build/consumer"

# pkg-config
export PKG_CONFIG_PATH="$WORK/prefix/lib/pkgconfig"
# shellcheck disable=SC2046
c++ -O1 "$HERE/consumer/main.cpp" -o "$WORK/consumer-pc" $(pkg-config --cflags --libs ember)
"$WORK/consumer-pc"
