// `redlite bench --record-routing FILE`: the file holds every pass of the bench protocol in order
// (the prompt's prefill, each decode pass, the long prefill) with the model's shape, and reads
// back through the validating reader; an unwritable path and --depths are refused by name.
#include <gtest/gtest.h>

#include <string>

#include "model/routing_record.h"
#include "test_util.h"

namespace {

using rl::test::run_redlite;

TEST(RecordRouting, BenchWritesEveryPassInOrder) {
  const std::string model = rl::test::fixture("tiny-qwen3next-q4km.gguf");
  RL_REQUIRE_FIXTURE(model);
  const std::string out = rl::test::temp_path("record-routing", "trace.bin");
  const auto r = run_redlite("bench -m '" + model + "' --backend cpu --threads 1 --reps 1 --prefill-tokens 20 " +
                             "--decode-tokens 5 --record-routing '" + out + "'");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const rl::RoutingRecording rec = rl::read_routing_recording(out);
  const auto m = rl::Model::open(model);
  EXPECT_EQ(rec.n_layer, m->config().n_layer);
  EXPECT_EQ(rec.n_expert, m->config().n_expert);
  EXPECT_EQ(rec.n_expert_used, m->config().n_expert_used);
  EXPECT_EQ(rec.slot_bytes, rl::expert_slot_bytes(*m));
  // The 16-token prompt, 4 decode passes (the first token comes from the prompt's logits), the
  // 20-token prefill.
  std::vector<int> tokens;
  for (const rl::RoutingPass& p : rec.passes) tokens.push_back(p.n_tokens);
  EXPECT_EQ(tokens, (std::vector<int>{16, 1, 1, 1, 1, 20}));
  rl::test::remove_temp(out);
}

TEST(RecordRouting, RefusesAnUnwritablePathAndDepths) {
  const std::string model = rl::test::fixture("tiny-qwen3next-q4km.gguf");
  RL_REQUIRE_FIXTURE(model);
  auto r = run_redlite("bench -m '" + model + "' --backend cpu --threads 1 --reps 1 --prefill-tokens 2 " +
                       "--decode-tokens 2 --record-routing /nonexistent-dir/trace.bin");
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("/nonexistent-dir/trace.bin.tmp: cannot create the routing recording"), std::string::npos)
      << r.out;
  r = run_redlite("bench -m '" + model + "' --depths 0 --record-routing x.bin");
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("does not combine with --depths"), std::string::npos) << r.out;
}

}  // namespace
