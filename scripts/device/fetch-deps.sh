#!/usr/bin/env bash
# Fills the git-ignored .deps/ that the GPU host's scripts carry (run here, on the development
# machine, after `apt-get update` once): .deps/debs, the Debian packages deps.sh unpacks there
# (PCRE2, cpp-httplib and the headers it needs, ../shared/DEVICE.md; ccache and its hiredis, so
# that a rebuild after a patch is reverted there hits the cache); .deps/fixB, fixture model B
# and its references (REDLITE_FIXTURES, default ../shared/fixtures); .deps/base/base-src.tgz, the
# base tree of ab.sh's A/B (BASE, a commit: default HEAD).
#   scripts/device/fetch-deps.sh [BASE]
# Then carry ".deps/fixB .deps/debs .deps/base" in the device call (41 + 6 + 1 MiB with the tree
# under the call's 64 MiB).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
FIXTURES=${REDLITE_FIXTURES:-$ROOT/../shared/fixtures}
BASE=${1:-HEAD}
mkdir -p "$ROOT/.deps/debs" "$ROOT/.deps/fixB" "$ROOT/.deps/base"
(cd "$ROOT/.deps/debs" && apt-get download -q libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 \
  libcpp-httplib-dev libcpp-httplib0.11 libbrotli-dev libssl-dev zlib1g-dev ccache libhiredis0.14) ||
  { echo "fetch-deps.sh: apt-get download failed (run apt-get update once)" >&2; exit 1; }
ls "$FIXTURES"/tiny-qwen3next-q4km.gguf > /dev/null || { echo "fetch-deps.sh: no fixture model B in $FIXTURES" >&2; exit 1; }
cp "$FIXTURES"/tiny-qwen3next-q4km* "$ROOT/.deps/fixB/"
git -C "$ROOT" archive --format=tar.gz -o "$ROOT/.deps/base/base-src.tgz" "$BASE"
du -sh "$ROOT"/.deps/debs "$ROOT"/.deps/fixB "$ROOT"/.deps/base
