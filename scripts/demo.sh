#!/usr/bin/env bash
# The README's first command: install dependencies, build, make a tiny random-weight model with
# `redlite synth`, and generate text from it with `redlite run`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$(nproc)" --target redlite
./build/redlite synth --preset tiny --out build/demo-tiny.gguf
./build/redlite inspect build/demo-tiny.gguf > build/demo-tiny.inspect.txt
head -n 20 build/demo-tiny.inspect.txt
./build/redlite run -m build/demo-tiny.gguf -p "Hello" -n 32 --seed 1
