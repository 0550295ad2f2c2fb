#!/usr/bin/env bash
# Fills the git-ignored .deps/ that the GPU host's scripts carry (run here, on the development
# machine, after `apt-get update` once): .deps/debs, the Debian packages deps.sh unpacks there
# (PCRE2, cpp-httplib and the headers it needs, ../shared/DEVICE.md; ccache and its hiredis, so
# that a rebuild after a patch is reverted there hits the cache); .deps/fixB, fixture model B
# and its references (REDLITE_FIXTURES, default ../shared/fixtures); .deps/base/base-src.tgz, the
# base tree of ab.sh's A/B (BASE, a commit: default HEAD); .deps/fixApack, fixture model A packed
# for `ab.sh unpack-a` (the gguf as xz -9e, its two reference JSONs and its last-logits files as
# tar.xz: 60 MiB, which with the tree fits a call's 64 MiB only carried alone, on a warm machine).
#   scripts/device/fetch-deps.sh [BASE]
# Then carry ".deps/fixB .deps/debs .deps/base" in the device call (41 + 6 + 1 MiB with the tree
# under the call's 64 MiB).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
FIXTURES=${REDLITE_FIXTURES:-$ROOT/../shared/fixtures}
BASE=${1:-HEAD}
mkdir -p "$ROOT/.deps/debs" "$ROOT/.deps/fixB" "$ROOT/.deps/base" "$ROOT/.deps/fixApack"
(cd "$ROOT/.deps/debs" && apt-get download -q libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 \
  libcpp-httplib-dev libcpp-httplib0.11 libbrotli-dev libssl-dev zlib1g-dev ccache libhiredis0.14) ||
  { echo "fetch-deps.sh: apt-get download failed (run apt-get update once)" >&2; exit 1; }
ls "$FIXTURES"/tiny-qwen3next-q4km.gguf > /dev/null || { echo "fetch-deps.sh: no fixture model B in $FIXTURES" >&2; exit 1; }
cp "$FIXTURES"/tiny-qwen3next-q4km* "$ROOT/.deps/fixB/"
A=tiny-qwen3next-iq2xxs
if [ -f "$FIXTURES/$A.gguf" ]; then
  xz -T0 -9e -c "$FIXTURES/$A.gguf" > "$ROOT/.deps/fixApack/$A.gguf.xz"
  (cd "$FIXTURES" && tar -cJf "$ROOT/.deps/fixApack/refs-json.tar.xz" $A.ref.json $A.ref-f32.json &&
    tar -cJf "$ROOT/.deps/fixApack/logits.tar.xz" $A.*.last_logits.f32)
else
  echo "fetch-deps.sh: no fixture model A in $FIXTURES: .deps/fixApack left empty" >&2
fi
git -C "$ROOT" archive --format=tar.gz -o "$ROOT/.deps/base/base-src.tgz" "$BASE"
du -sh "$ROOT"/.deps/debs "$ROOT"/.deps/fixB "$ROOT"/.deps/base "$ROOT"/.deps/fixApack
