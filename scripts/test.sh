#!/usr/bin/env bash
# The whole test suite: release build (CUDA compiled when nvcc exists; GPU tests skip without a
# GPU), every CTest test, then the GGUF parser's corruption tests again under AddressSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
# Relative paths are taken from the repository root; tests run from the build folder.
export REDLITE_FIXTURES="$(realpath -m "${REDLITE_FIXTURES:-../shared/fixtures}")"
jobs="${JOBS:-$(nproc)}"

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DREDLITE_TESTS=ON -DREDLITE_BENCH=ON >/dev/null
cmake --build build -j"$jobs"

# Node client for the server tests (the official openai package), installed once.
if [ -f tests/server/package.json ] && [ ! -d tests/server/node_modules ]; then
  (cd tests/server && npm ci --no-audit --no-fund --loglevel=error)
fi

status=0
ctest --test-dir build --output-on-failure -j"$jobs" --timeout 1200 || status=1

cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DREDLITE_ASAN=ON -DREDLITE_CUDA=OFF \
  -DREDLITE_BENCH=OFF >/dev/null
cmake --build build-asan -j"$jobs" --target test_gguf
echo "== GGUF parser tests under AddressSanitizer"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 ./build-asan/test_gguf --gtest_brief=1 || status=1

exit $status
