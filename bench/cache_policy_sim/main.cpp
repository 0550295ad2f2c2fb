// cache_policy_sim: replays a routing recording (`redlite bench --record-routing FILE`) through the
// engine's own ExpertCache under several replacement policies and budgets, and reports each one's
// hit rate, so policies are compared on the same accesses (docs/cache.md).
//
// Each pass, layer by layer, reserves what the CUDA backend's host-routed path reserves
// (ExpertCache::layer_request, in batches of at most the cache's slots) and commits: the cache
// starts empty, as a bounded cache does (a cache that holds every expert is preloaded and never
// misses, so it is not simulated). The bench counts its hit rate over the decode passes only;
// both that and the rate over every pass are reported, with the bound no policy can pass: the
// rate of a cache that starts empty and never evicts (misses are first uses only).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "cache/expert_cache.h"
#include "common/error.h"
#include "model/routing_record.h"

namespace {

using rl::CachePolicy;
using rl::ExpertCache;
using rl::RoutingRecording;

struct Counts {
  uint64_t hits = 0, misses = 0;
  void add(const ExpertCache::Stats& after, const ExpertCache::Stats& before) {
    hits += after.hits - before.hits;
    misses += after.misses - before.misses;
  }
  double rate() const { return hits + misses ? double(hits) / double(hits + misses) : 0.0; }
};

struct Replay {
  Counts all, decode;
  uint64_t evictions = 0;
};

Replay replay(const RoutingRecording& rec, ExpertCache& cache) {
  Replay out;
  std::vector<int32_t> ids;
  for (size_t p = 0; p < rec.passes.size(); p++) {
    const int T = rec.passes[p].n_tokens;
    const ExpertCache::Stats before = cache.stats();
    for (int L = 0; L < rec.n_layer; L++) {
      const auto layer_ids = rec.layer_ids(p, L);
      ids.assign(layer_ids.begin(), layer_ids.end());
      const std::vector<int> request = ExpertCache::layer_request(ids, T, rec.n_expert_used);
      const size_t batch = std::min(request.size(), (size_t)cache.n_slots());
      for (size_t b0 = 0; b0 < request.size(); b0 += batch) {
        cache.reserve(L, std::span<const int>(request).subspan(b0, std::min(batch, request.size() - b0)));
        cache.commit();
      }
    }
    out.all.add(cache.stats(), before);
    if (T == 1) out.decode.add(cache.stats(), before);
  }
  out.evictions = cache.stats().evictions;
  return out;
}

struct Options {
  std::string recording;
  std::vector<int64_t> slots, mib;
  uint64_t slot_bytes = 0;
  std::vector<std::string> policies = {"lru", "lrfu"};
  std::vector<double> half_lives = {rl::kDefaultLrfuHalfLifePasses};
  bool json = false;
};

int run(const Options& o) {
  const RoutingRecording rec = rl::read_routing_recording(o.recording);
  const uint64_t slot_bytes = o.slot_bytes ? o.slot_bytes : rec.slot_bytes;
  const int64_t n_total = (int64_t)rec.n_layer * rec.n_expert;
  // Budgets as slot counts: --slots as given, --mib through the slot size (as --cache-mib does).
  std::vector<std::pair<std::string, int64_t>> budgets;
  for (int64_t s : o.slots) budgets.emplace_back(std::to_string(s) + " slots", s);
  if (!o.mib.empty() && slot_bytes == 0)
    rl::fail("{}: the recording names no slot size; give --slot-bytes to use --mib", o.recording);
  for (int64_t m : o.mib) budgets.emplace_back(std::to_string(m) + " MiB", (int64_t)(((uint64_t)m << 20) / slot_bytes));
  if (budgets.empty()) rl::fail("give at least one budget (--slots or --mib)");

  nlohmann::json rows = nlohmann::json::array();
  // The bound of every policy at every budget: a cache with a slot for every expert, starting empty,
  // misses only each expert's first use.
  ExpertCache unbounded(rec.n_layer, rec.n_expert, 1, (size_t)n_total, rec.n_expert_used);
  const Replay bound = replay(rec, unbounded);
  if (!o.json)
    std::printf("%s: %zu passes, %zu tokens, %d layers x %d experts (top %d), slot %llu bytes\n"
                "  bound (first uses only) hit rate %.4f (decode passes %.4f), %llu misses\n",
                o.recording.c_str(), rec.passes.size(), rec.n_tokens(), rec.n_layer, rec.n_expert,
                rec.n_expert_used, (unsigned long long)slot_bytes, bound.all.rate(), bound.decode.rate(),
                (unsigned long long)bound.all.misses);
  for (const auto& [label, n_slots] : budgets) {
    if (n_slots < rec.n_expert_used)
      rl::fail("budget {} holds {} slots, fewer than the {} experts a token selects in one layer", label, n_slots,
               rec.n_expert_used);
    if (n_slots >= n_total) {
      if (!o.json) std::printf("  %-14s every expert fits (%lld slots): preloaded, no misses\n", label.c_str(), (long long)n_total);
      continue;
    }
    for (const std::string& name : o.policies) {
      CachePolicy policy;
      policy.kind = rl::parse_cache_policy(name);
      const std::vector<double> hls = policy.kind == CachePolicy::Kind::kLrfu ? o.half_lives : std::vector<double>{0};
      for (double hl : hls) {
        policy.half_life = hl * rec.n_layer;  // passes -> cache accesses
        ExpertCache cache(rec.n_layer, rec.n_expert, 1, (size_t)n_slots, rec.n_expert_used, policy);
        const Replay r = replay(rec, cache);
        rows.push_back({{"budget", label}, {"slots", n_slots}, {"policy", name}, {"half_life_passes", hl},
                        {"hit_rate", r.all.rate()}, {"decode_hit_rate", r.decode.rate()},
                        {"hits", r.all.hits}, {"misses", r.all.misses}, {"evictions", r.evictions}});
        if (!o.json) {
          const std::string pol = policy.kind == CachePolicy::Kind::kLrfu ? fmt::format("lrfu h={}", hl) : name;
          std::printf("  %-14s %6lld slots  %-12s hit rate %.4f (decode passes %.4f), %llu misses\n", label.c_str(),
                      (long long)n_slots, pol.c_str(), r.all.rate(), r.decode.rate(), (unsigned long long)r.all.misses);
        }
      }
    }
  }
  if (o.json) {
    nlohmann::json j{{"recording", o.recording}, {"passes", rec.passes.size()}, {"tokens", rec.n_tokens()},
                     {"slot_bytes", slot_bytes}, {"bound_hit_rate", bound.all.rate()},
                     {"bound_decode_hit_rate", bound.decode.rate()}, {"results", rows}};
    std::printf("%s\n", j.dump(2).c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Replay a routing recording through ExpertCache under several policies and budgets (docs/cache.md)"};
  Options o;
  app.add_option("recording", o.recording, "file written by redlite bench --record-routing")->required();
  app.add_option("--slots", o.slots, "budgets as numbers of expert slots (comma-separated)")
      ->delimiter(',')->check(CLI::PositiveNumber);
  app.add_option("--mib", o.mib, "budgets in MiB, as --cache-mib: slots = MiB / slot size (comma-separated)")
      ->delimiter(',')->check(CLI::PositiveNumber);
  app.add_option("--slot-bytes", o.slot_bytes, "bytes of one slot (default: the recording's, from the model)")
      ->check(CLI::PositiveNumber);
  app.add_option("--policies", o.policies, "policies to compare: lru, lrfu (comma-separated)")
      ->delimiter(',')
      ->check(CLI::IsMember({"lru", "lrfu"}));
  app.add_option("--half-life", o.half_lives, "LRFU half-lives in passes (comma-separated; each is a row)")
      ->delimiter(',')->check(CLI::PositiveNumber);
  app.add_flag("--json", o.json, "print the results as JSON");
  CLI11_PARSE(app, argc, argv);
  try {
    return run(o);
  } catch (const rl::Error& e) {
    std::fprintf(stderr, "cache_policy_sim: %s\n", e.what());
    return 1;
  }
}
