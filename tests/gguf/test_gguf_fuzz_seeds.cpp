// Writes the fuzzer's seed corpus (small valid GGUF files made with GgufWriter) into the directory
// named by RL_GGUF_SEED_DIR; skipped otherwise. See docs/perf/gguf.md for how the fuzzer is run.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "gguf_sample.h"

namespace rl {
namespace {

// A model-shaped file: qwen3next-style keys, a small tokenizer, a few tensors of the real names.
GgufWriter model_like_seed() {
  GgufWriter w;
  w.add_string("general.architecture", "qwen3next");
  w.add_string("general.name", "seed");
  w.add_u32("qwen3next.block_count", 2);
  w.add_u32("qwen3next.embedding_length", 32);
  w.add_u32("qwen3next.expert_count", 4);
  w.add_u32("qwen3next.expert_used_count", 2);
  w.add_f32("qwen3next.attention.layer_norm_rms_epsilon", 1e-6f);
  w.add_f32("qwen3next.rope.freq_base", 1e7f);
  w.add_string("tokenizer.ggml.model", "gpt2");
  w.add_string("tokenizer.ggml.pre", "qwen2");
  w.add_array_string("tokenizer.ggml.tokens", {"a", "b", "ab", "<|im_start|>"});
  w.add_array_i32("tokenizer.ggml.token_type", {1, 1, 1, 3});
  w.add_array_string("tokenizer.ggml.merges", {"a b"});
  w.add_u32("tokenizer.ggml.eos_token_id", 3);
  w.add_bool("tokenizer.ggml.add_bos_token", false);
  w.add_string("tokenizer.chat_template", "{{ messages }}");
  auto fill = [](uint8_t* dst, int64_t first, int64_t n) {
    for (int64_t i = 0; i < n * 8; i++) dst[i] = (uint8_t)(first * 8 + i);
  };
  w.add_tensor("token_embd.weight", GgmlType::F16, {32, 4}, fill);
  w.add_tensor("blk.0.attn_norm.weight", GgmlType::F32, {32}, fill);
  w.add_tensor("blk.0.ffn_gate_exps.weight", GgmlType::Q8_0, {32, 2, 4}, fill);
  w.add_tensor("blk.1.ffn_down_exps.weight", GgmlType::IQ4_NL, {32, 2, 4}, fill);
  return w;
}

TEST(GgufFuzzSeeds, WriteSeedCorpus) {
  const char* dir = std::getenv("RL_GGUF_SEED_DIR");
  if (!dir || !*dir) GTEST_SKIP() << "set RL_GGUF_SEED_DIR to write the fuzz seed corpus";
  std::filesystem::create_directories(dir);
  const std::string d = dir;
  test::sample_writer(32).write(d + "/sample-align32.gguf");
  test::sample_writer(64).write(d + "/sample-align64.gguf");
  GgufWriter().write(d + "/empty.gguf");
  model_like_seed().write(d + "/model-like.gguf");
  {
    GgufWriter w(128);
    w.add_array("nested", GgufWriter::array(std::vector<GgufWriter::Array>{
                              GgufWriter::array(std::vector<GgufWriter::Array>{GgufWriter::array(std::vector<double>{1.5})}),
                              GgufWriter::array(std::vector<int16_t>{-1, 2}),
                          }));
    w.add_tensor("t", GgmlType::Q4_K, {256, 1}, [](uint8_t* dst, int64_t, int64_t) { std::memset(dst, 0x11, 144); });
    w.write(d + "/nested-align128.gguf");
  }
  for (const auto& entry : std::filesystem::directory_iterator(d))
    EXPECT_NO_THROW(GgufFile::open(entry.path().string())) << entry.path();
}

}  // namespace
}  // namespace rl
