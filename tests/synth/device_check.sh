#!/usr/bin/env bash
# On the GPU host (16 cores): build the CPU-only redlite + test_synth, time `synth --preset 80b`
# (wall time and peak memory), compare its tensor table with the fixture, run the CPU oracle on it
# and on the tiny preset, and run the synth tests. Results under $OUT.
#   carry: .deps/debs (PCRE2/httplib packages, DEVICE.md) and .deps/synth (80b-seed-mix.tensors.json)
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$ROOT/out}; mkdir -p "$OUT"
PREFIX=/tmp/rl-prefix
if [ ! -d $PREFIX/usr ]; then
  for f in "$ROOT"/.deps/debs/*.deb; do dpkg -x "$f" $PREFIX; done
  sed -i "s#^prefix=/usr#prefix=$PREFIX/usr#" $PREFIX/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc
fi
LIBDIR=$PREFIX/usr/lib/x86_64-linux-gnu
export CMAKE_PREFIX_PATH=$PREFIX/usr PKG_CONFIG_PATH=$LIBDIR/pkgconfig LD_LIBRARY_PATH=$LIBDIR CPATH=$PREFIX/usr/include
B=$ROOT/build-synth-device
cmake -S "$ROOT" -B $B -G Ninja -DREDLITE_CUDA=OFF -DREDLITE_BENCH=OFF -DCMAKE_LIBRARY_PATH=$LIBDIR > "$OUT/configure.log" 2>&1 || { tail -20 "$OUT/configure.log"; exit 1; }
ninja -C $B -j16 redlite test_synth > "$OUT/build.log" 2>&1 || { grep -E "error|FAILED" -A3 "$OUT/build.log" | head -40; exit 1; }
M=/dev/shm/synth-80b.gguf
echo "== synth 80b seed-mix"
/usr/bin/time -v $B/redlite synth --preset 80b --recipe seed-mix --seed 1 --out $M 2> "$OUT/time-80b.txt"
grep -E "Elapsed|Maximum resident|Exit status" "$OUT/time-80b.txt"; ls -l $M
REDLITE_SYNTH_80B=$M REDLITE_FIXTURES=$ROOT/.deps/synth $B/test_synth --gtest_filter='SynthFile80b*' 2>&1 | tail -5
echo "== oracle on 80b"
$B/redlite logits -m $M --tokens 9707,11,1879,0,14990,13,220,16,17,18 --all-positions --out "$OUT/80b.logits.f32" --backend cpu 2>&1 | tail -3
python3 -c "
import numpy as np,sys
x=np.fromfile('$OUT/80b.logits.f32',dtype=np.float32).reshape(-1,151936)
print('80b logits: positions',x.shape[0],'finite',bool(np.isfinite(x).all()),'std per pos',np.round(x.std(1),2),'argmax',x.argmax(1))"
echo "== tiny"
$B/redlite synth --preset tiny --out /tmp/tiny.gguf
$B/redlite logits -m /tmp/tiny.gguf --tokens 1,2,3,4,5 --all-positions --out "$OUT/tiny.logits.f32" --backend cpu 2>&1 | tail -3
python3 -c "
import numpy as np
x=np.fromfile('$OUT/tiny.logits.f32',dtype=np.float32).reshape(5,-1)
print('tiny logits finite',bool(np.isfinite(x).all()),'std',np.round(x.std(1),2))"
echo "== test_synth"
REDLITE_FIXTURES=$ROOT/.deps/synth $B/test_synth 2>&1 | grep -vE "^\[ +(RUN|OK) " | tail -40
rm -f $M
