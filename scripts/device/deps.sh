# Sourced by the GPU host's scripts: unpacks the carried Debian packages (.deps/debs, made by
# fetch-deps.sh: PCRE2, cpp-httplib and the headers it needs, ../shared/DEVICE.md; ccache) into a
# prefix once and points the build at it. Sets RL_DEPS_LIBDIR; ROOT (the tree) defaults to the one holding this script.
ROOT=${ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
RL_DEPS_PREFIX=/tmp/rl-prefix
if [ ! -d $RL_DEPS_PREFIX/usr ]; then
  if ! ls "$ROOT"/.deps/debs/*.deb > /dev/null 2>&1; then
    echo "deps.sh: no Debian packages in $ROOT/.deps/debs (carry .deps/debs, ../shared/DEVICE.md)" >&2
    return 1 2> /dev/null || exit 1
  fi
  for f in "$ROOT"/.deps/debs/*.deb; do dpkg -x "$f" $RL_DEPS_PREFIX; done
  sed -i "s#^prefix=/usr#prefix=$RL_DEPS_PREFIX/usr#" $RL_DEPS_PREFIX/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc
fi
RL_DEPS_LIBDIR=$RL_DEPS_PREFIX/usr/lib/x86_64-linux-gnu
export CMAKE_PREFIX_PATH=$RL_DEPS_PREFIX/usr
export PKG_CONFIG_PATH=$RL_DEPS_LIBDIR/pkgconfig
export LD_LIBRARY_PATH=$RL_DEPS_LIBDIR:${LD_LIBRARY_PATH:-}
export CPATH=$RL_DEPS_PREFIX/usr/include:$RL_DEPS_PREFIX/usr/include/x86_64-linux-gnu
# The carried ccache (.deps/debs, scripts/device/fetch-deps.sh) where the host has none.
export PATH=/usr/local/cuda/bin:$PATH:$RL_DEPS_PREFIX/usr/bin
# rl_configure SRC BUILD: the GPU host's Release build of SRC for the H200 (sm_90a) against the
# unpacked packages, through ccache where the host has it (its cache in /tmp, which is writable).
export CCACHE_DIR=${CCACHE_DIR:-/tmp/rl-ccache}
# rl_sync_sources SRC BUILD: a warm machine's BUILD keeps the objects of the last tree configured
# there, and a call's tree keeps its files' times, so a file whose content differs from that tree's
# but is older than its objects would not be rebuilt (a binary of two trees: seen 2026-12-07). The
# files whose checksum differs from BUILD's record of the last configure are touched first.
rl_sync_sources() {
  local record now
  mkdir -p "$2" && record=$(cd "$2" && pwd)/.rl-sources.md5
  now=$(cd "$1" && find src tests bench CMakeLists.txt -type f 2> /dev/null | LC_ALL=C sort | xargs -r md5sum)
  [ -f "$record" ] && (cd "$1" && diff "$record" - <<< "$now" | awk '/^> / {print $3}' | xargs -r touch)
  printf '%s\n' "$now" > "$record"
}
rl_configure() {
  rl_sync_sources "$1" "$2"
  local launcher=()
  command -v ccache > /dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DREDLITE_BENCH=OFF -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DCMAKE_LIBRARY_PATH="$RL_DEPS_LIBDIR" "${launcher[@]}" > /dev/null
}
