// The cost of prompt-cache snapshots at depth on the CPU backend (the fast tier, f16 KV cache as
// the command line's default): after a prefill of DEPTH tokens, the median time and the bytes() of
// snapshot(), the time of restoring it into the same session (rows intact) and into another one,
// and the time of the first one-token pass that overwrites rows a snapshot shares (the copy the
// shared rows cost when the session rewinds and diverges; model/kv_share.h) against that pass
// with no snapshot alive.
//
//   build-x/bench_snapshot MODEL.gguf [DEPTH] [THREADS]
//
// Made for `redlite synth --preset tiny --n-layer 8 --head-dim 128 --rope-dim 32` (two attention
// layers, 2 KiB of f16 KV a token); it uses only the Session interface, so it builds against
// trees from before shared rows too.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <vector>

#include "cpu/cpu_backend.h"
#include "model/model.h"

namespace {

constexpr int kReps = 21;

// Median microseconds of `timed`, each repetition after `setup` (not timed).
double median_us(const std::function<void()>& setup, const std::function<void()>& timed) {
  std::vector<double> us;
  for (int r = 0; r < kReps; r++) {
    setup();
    const auto t0 = std::chrono::steady_clock::now();
    timed();
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::nth_element(us.begin(), us.begin() + kReps / 2, us.end());
  return us[kReps / 2];
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL.gguf [DEPTH] [THREADS]\n", argv[0]);
    return 2;
  }
  const int depth = argc > 2 ? std::atoi(argv[2]) : 4096;
  const int threads = argc > 3 ? std::atoi(argv[3]) : 2;
  auto model = rl::Model::open(argv[1]);
  const rl::Config& c = model->config();
  auto backend = rl::cpu::make_cpu_backend(model, threads, rl::Numerics::kFast, rl::KvType::kF16);
  std::vector<int32_t> prompt(depth);
  for (int i = 0; i < depth; i++) prompt[i] = (int32_t)((i * 7919 + 13) % c.n_vocab);

  auto session = backend->new_session(depth + 16);
  session->reserve_context();
  session->prefill(prompt);
  std::printf("depth %d: KV %zu bytes (f16), recurrent states %zu bytes\n", depth,
              c.kv_bytes_per_token(rl::KvType::kF16) * (size_t)depth, c.recurrent_state_bytes());

  std::unique_ptr<rl::SessionSnapshot> snap;
  const double take = median_us([&] { snap.reset(); }, [&] { snap = session->snapshot(); });
  std::printf("snapshot()                     %10.1f us   bytes() %zu\n", take, snap->bytes());
  const double same = median_us([] {}, [&] { session->restore(*snap); });
  std::printf("restore, same session          %10.1f us\n", same);
  auto other = backend->new_session(depth + 16);
  other->reserve_context();
  // A new snapshot of `session` each time: restored, a snapshot references the rows it was
  // restored into, so a second restore into `other` would be one into the same session.
  const double into_other = median_us([&] { snap = session->snapshot(); }, [&] { other->restore(*snap); });
  std::printf("restore, another session       %10.1f us\n", into_other);

  // The first write below the snapshot's position: a fresh snapshot each time, so the pass finds
  // rows to freeze (none where snapshots copy their rows when taken).
  const int32_t token = 1;
  const double alone = median_us([&] { snap.reset(); session->reset(); }, [&] { session->prefill({&token, 1}); });
  const double overwrite = median_us(
      [&] {
        session->restore(*other->snapshot());
        snap = session->snapshot();
        session->reset();
      },
      [&] { session->prefill({&token, 1}); });
  std::printf("first pass at 0, no snapshot   %10.1f us\n", alone);
  std::printf("first pass at 0, snapshot alive%10.1f us   bytes() after %zu\n", overwrite, snap->bytes());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_snapshot: %s\n", e.what());
  return 1;
}
