# Sourced by the GPU host's scripts: unpacks the carried Debian packages (.deps/debs: PCRE2,
# cpp-httplib and the headers it needs, ../shared/DEVICE.md) into a prefix once and points the
# build at it. Sets RL_DEPS_LIBDIR.
RL_DEPS_PREFIX=/tmp/rl-prefix
if [ ! -d $RL_DEPS_PREFIX/usr ]; then
  for f in "$ROOT"/.deps/debs/*.deb; do dpkg -x "$f" $RL_DEPS_PREFIX; done
  sed -i "s#^prefix=/usr#prefix=$RL_DEPS_PREFIX/usr#" $RL_DEPS_PREFIX/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc
fi
RL_DEPS_LIBDIR=$RL_DEPS_PREFIX/usr/lib/x86_64-linux-gnu
export CMAKE_PREFIX_PATH=$RL_DEPS_PREFIX/usr
export PKG_CONFIG_PATH=$RL_DEPS_LIBDIR/pkgconfig
export LD_LIBRARY_PATH=$RL_DEPS_LIBDIR:${LD_LIBRARY_PATH:-}
export CPATH=$RL_DEPS_PREFIX/usr/include:$RL_DEPS_PREFIX/usr/include/x86_64-linux-gnu
export PATH=/usr/local/cuda/bin:$PATH
