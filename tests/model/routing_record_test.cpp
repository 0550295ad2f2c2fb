// Routing recordings (src/model/routing_record): the byte layout docs/cache.md documents, the
// reader's refusal of every truncation and malformed field, the recorder's pass boundaries, and
// the recorder against the parity trace recorder on the CPU oracle.
#include "model/routing_record.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "cpu/cpu_backend.h"
#include "model/parity.h"
#include "test_util.h"

namespace rl {
namespace {

// 2 layers, 5 experts, top 2; a pass of 2 tokens, then one of 1.
RoutingRecording small_recording() {
  RoutingRecording r;
  r.n_layer = 2;
  r.n_expert = 5;
  r.n_expert_used = 2;
  r.slot_bytes = 0x0102030405ull;
  r.passes.push_back(RoutingPass{2, {4, 0, 1, 2, /* layer 1 */ 3, 4, 0, 1}});
  r.passes.push_back(RoutingPass{1, {2, 3, /* layer 1 */ 1, 4}});
  return r;
}

std::vector<uint8_t> file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

void put_bytes(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), (std::streamsize)b.size());
}

std::string read_error(const std::string& path) {
  try {
    read_routing_recording(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The layout byte for byte, written out here from the format's description.
TEST(RoutingRecord, BytesAsDocumentedAndReadBack) {
  const std::string path = test::temp_path("routing-record", "small.bin");
  write_routing_recording(path, small_recording());
  std::vector<uint8_t> want = {'R', 'L', 'R', 'O', 'U', 'T', 'E', 0, 1, 0, 0, 0, 2, 0, 0, 0, 5, 0, 0, 0, 2, 0, 0, 0,
                               5, 4, 3, 2, 1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0,
                               2, 0, 0, 0, 4, 0, 0, 0, 1, 0, 2, 0, 3, 0, 4, 0, 0, 0, 1, 0,
                               1, 0, 0, 0, 2, 0, 3, 0, 1, 0, 4, 0};
  EXPECT_EQ(file_bytes(path), want);
  const RoutingRecording got = read_routing_recording(path);
  EXPECT_EQ(got.n_layer, 2);
  EXPECT_EQ(got.n_expert, 5);
  EXPECT_EQ(got.n_expert_used, 2);
  EXPECT_EQ(got.slot_bytes, 0x0102030405ull);
  ASSERT_EQ(got.passes.size(), 2u);
  EXPECT_EQ(got.passes[0].ids, small_recording().passes[0].ids);
  EXPECT_EQ(got.passes[1].ids, small_recording().passes[1].ids);
  EXPECT_EQ(got.n_tokens(), 3u);
  const auto l1 = got.layer_ids(0, 1);
  EXPECT_EQ(std::vector<uint16_t>(l1.begin(), l1.end()), (std::vector<uint16_t>{3, 4, 0, 1}));
  test::remove_temp(path);
}

TEST(RoutingRecord, EveryTruncationIsRefused) {
  const std::string path = test::temp_path("routing-record", "cut.bin");
  write_routing_recording(path, small_recording());
  const std::vector<uint8_t> whole = file_bytes(path);
  for (size_t n = 0; n < whole.size(); n++) {
    put_bytes(path, std::vector<uint8_t>(whole.begin(), whole.begin() + n));
    const std::string err = read_error(path);
    EXPECT_TRUE(err.find("truncated") != std::string::npos || err.find("not a routing recording") != std::string::npos)
        << n << " bytes: '" << err << "'";
  }
  test::remove_temp(path);
}

TEST(RoutingRecord, MalformedFieldsAreNamed) {
  const std::string path = test::temp_path("routing-record", "bad.bin");
  write_routing_recording(path, small_recording());
  const std::vector<uint8_t> whole = file_bytes(path);
  struct Case {
    size_t offset;
    uint8_t value;
    const char* message;
  };
  const Case cases[] = {
      {0, 'X', "not a routing recording"},  {8, 2, "version 2"},
      {12, 0, "shape out of range"},        {20, 6, "shape out of range"},  // top 6 of 5 experts
      {40, 0, "has 0 tokens"},              {44, 5, "selects expert 5"},    // ids are below n_expert
      {46, 4, "twice for one token"},       {32, 4, "header names 4 passes"},
  };
  for (const Case& c : cases) {
    std::vector<uint8_t> b = whole;
    b[c.offset] = c.value;
    put_bytes(path, b);
    EXPECT_NE(read_error(path).find(c.message), std::string::npos)
        << "byte " << c.offset << " = " << int(c.value) << ": '" << read_error(path) << "'";
  }
  std::vector<uint8_t> longer = whole;
  longer.push_back(0);
  put_bytes(path, longer);
  EXPECT_NE(read_error(path).find("trailing bytes"), std::string::npos) << read_error(path);
  test::remove_temp(path);
  EXPECT_NE(read_error(path).find("cannot open"), std::string::npos);
}

TEST(RoutingRecord, RecorderSplitsPassesAtLayerZero) {
  RoutingRecorder rec(2, 5, 2, 7);
  const int32_t a[] = {4, 0, 1, 2}, b[] = {3, 4, 0, 1}, c[] = {2, 3}, d[] = {1, 4};
  rec.ids("ffn_moe_topk-0", 2, 2, a);
  rec.ids("other-1", 1, 1, a);  // not a selection: ignored
  rec.ids("ffn_moe_topk-1", 2, 2, b);
  rec.ids("ffn_moe_topk-0", 1, 2, c);
  EXPECT_THROW(rec.recording(), Error);  // the second pass has not reached layer 1
  EXPECT_THROW(rec.ids("ffn_moe_topk-0", 1, 2, c), Error);  // a pass before the last one ended
  rec.ids("ffn_moe_topk-1", 1, 2, d);
  const RoutingRecording& r = rec.recording();
  ASSERT_EQ(r.passes.size(), 2u);
  EXPECT_EQ(r.passes[0].ids, small_recording().passes[0].ids);
  EXPECT_EQ(r.passes[1].ids, small_recording().passes[1].ids);
  EXPECT_EQ(r.slot_bytes, 7u);
  RoutingRecorder wrong(2, 5, 2, 0);
  EXPECT_THROW(wrong.ids("ffn_moe_topk-1", 1, 2, c), Error);  // a pass must begin at layer 0
  EXPECT_THROW(wrong.ids("ffn_moe_topk-0", 1, 3, a), Error);  // width is not top-k
}

// Forwards every call to two sinks.
struct Tee final : TraceSink {
  TraceSink *a, *b;
  Tee(TraceSink* x, TraceSink* y) : a(x), b(y) {}
  void tensor(std::string_view n, int t, int w, const float* d) override { a->tensor(n, t, w, d), b->tensor(n, t, w, d); }
  void ids(std::string_view n, int t, int w, const int32_t* d) override { a->ids(n, t, w, d), b->ids(n, t, w, d); }
};

// On the oracle: a prefill and decode steps give one pass each, and each layer's selections over
// the passes are those the parity recorder (which concatenates the passes) saw.
TEST(RoutingRecord, RecorderOnTheOracleMatchesTheParityTrace) {
  const std::string path = test::fixture("tiny-qwen3next-q4km.gguf");
  RL_REQUIRE_FIXTURE(path);
  auto model = Model::open(path);
  const Config& c = model->config();
  auto backend = cpu::make_cpu_backend(model, 1);
  auto session = backend->new_session(64);
  RoutingRecorder rec(c.n_layer, c.n_expert, c.n_expert_used, expert_slot_bytes(*model));
  RecordingTrace parity;
  Tee tee(&rec, &parity);
  session->set_trace(&tee);
  std::vector<float> logits = session->prefill(std::vector<int32_t>{1, 2, 3, 4, 5});
  for (int i = 0; i < 3; i++) logits = session->decode(argmax(logits));
  session->set_trace(nullptr);
  const RoutingRecording& r = rec.recording();
  ASSERT_EQ(r.passes.size(), 4u);
  EXPECT_EQ(r.passes[0].n_tokens, 5);
  for (int L = 0; L < c.n_layer; L++) {
    std::vector<int32_t> joined;
    for (size_t p = 0; p < r.passes.size(); p++)
      for (uint16_t id : r.layer_ids(p, L)) joined.push_back(id);
    EXPECT_EQ(joined, parity.tensors.at("ffn_moe_topk-" + std::to_string(L)).i32) << "layer " << L;
  }
  // Gate, up and down of one expert, each padded to 256 bytes; the largest layer's (the fixture's
  // layers differ in their types).
  auto pad = [](size_t n) { return (n + 255) / 256 * 256; };
  size_t largest = 0, smallest = SIZE_MAX;
  for (const LayerWeights& lw : model->layers) {
    const MoeWeights& w = lw.moe;
    const size_t bytes =
        pad(w.gate_exps.matrix(0).nbytes) + pad(w.up_exps.matrix(0).nbytes) + pad(w.down_exps.matrix(0).nbytes);
    largest = std::max(largest, bytes);
    smallest = std::min(smallest, bytes);
  }
  EXPECT_EQ(expert_slot_bytes(*model), largest);
  EXPECT_LT(smallest, largest);  // (so the test tells the largest from the first)
}

}  // namespace
}  // namespace rl
