// bench/cache_policy_sim on a hand-made recording whose hit rates are worked out by hand, and its
// refusal of a truncated recording.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <string>

#include "model/routing_record.h"
#include "test_util.h"

namespace {

rl::test::ShellRun run_sim(const std::string& args) {
  return rl::test::run_shell("'" + std::string(CACHE_POLICY_SIM_BIN) + "' " + args + " 2>&1");
}

// One layer of 4 experts, top 1; decode passes select 0 1 0 2 1 0, 2 slots.
//   LRU:  0 miss, 1 miss, 0 hit, 2 evicts 1, 1 evicts 0, 0 evicts 2: 1 hit of 6.
//   LRFU (half-life 1000 passes, about counts): at 2, expert 0 (2 uses) stays and 1 (1 use) goes;
//   at 1, expert 1's kept history (1 use) plus the new one do not matter: the victim is 2 (1 use,
//   against 0's 2); then 0 hits: 2 hits of 6.
//   Bound (first uses only): 3 hits of 6.
TEST(CachePolicySim, HandWorkedHitRates) {
  rl::RoutingRecording rec;
  rec.n_layer = 1;
  rec.n_expert = 4;
  rec.n_expert_used = 1;
  rec.slot_bytes = 1 << 20;
  for (uint16_t e : {0, 1, 0, 2, 1, 0}) rec.passes.push_back(rl::RoutingPass{1, {e}});
  const std::string path = rl::test::temp_path("cache-policy-sim", "hand.bin");
  rl::write_routing_recording(path, rec);
  const auto r = run_sim("'" + path + "' --slots 2 --mib 2 --policies lru,lrfu --half-life 1000 --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_DOUBLE_EQ(j["bound_decode_hit_rate"].get<double>(), 0.5);
  ASSERT_EQ(j["results"].size(), 4u);  // 2 budgets x 2 policies; --mib 2 = 2 slots of 1 MiB
  for (const auto& row : j["results"]) {
    EXPECT_EQ(row["slots"].get<int>(), 2);
    const double want = row["policy"] == "lru" ? 1.0 / 6 : 2.0 / 6;
    EXPECT_DOUBLE_EQ(row["decode_hit_rate"].get<double>(), want) << row.dump();
    EXPECT_DOUBLE_EQ(row["hit_rate"].get<double>(), want) << row.dump();
  }
  // Truncated by one byte: refused, naming the file.
  {
    std::ifstream in(path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes.substr(0, bytes.size() - 1);
  }
  const auto bad = run_sim("'" + path + "' --slots 2");
  EXPECT_EQ(bad.exit_code, 1) << bad.out;
  EXPECT_NE(bad.out.find(path + ": routing recording truncated"), std::string::npos) << bad.out;
  rl::test::remove_temp(path);
}

}  // namespace
