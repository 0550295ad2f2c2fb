// Every fixture GGUF (the two tiny Qwen3-Next models and the quant zoo, all written by llama.cpp)
// parses, and what the reader reports matches the fixtures README.
#include <gtest/gtest.h>

#include <map>

#include "common/error.h"
#include "gguf/gguf.h"
#include "gguf_touch.h"
#include "test_util.h"

namespace rl {
namespace {

std::map<std::string, int> type_counts(const GgufFile& f) {
  std::map<std::string, int> counts;
  for (const auto& t : f.tensors()) counts[type_name(t.type)]++;
  return counts;
}

void expect_tensor(const GgufFile& f, const std::string& name, GgmlType type, std::vector<int64_t> ne) {
  const GgufTensorInfo* t = f.find_tensor(name);
  ASSERT_NE(t, nullptr) << name;
  EXPECT_EQ(t->type, type) << name;
  ASSERT_EQ(t->n_dims, ne.size()) << name;
  for (size_t d = 0; d < ne.size(); d++) EXPECT_EQ(t->ne[d], ne[d]) << name << " ne[" << d << "]";
}

TEST(GgufFixtures, ModelAParses) {
  const std::string path = test::fixture("tiny-qwen3next-iq2xxs.gguf");
  RL_REQUIRE_FIXTURE(path);
  auto f = GgufFile::open(path);
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->file_size(), 59801760u);
  EXPECT_EQ(f->get_string("general.architecture"), "qwen3next");
  EXPECT_EQ(f->get_uint("qwen3next.block_count"), 4u);
  EXPECT_EQ(f->get_uint("qwen3next.expert_count"), 64u);
  EXPECT_EQ(f->get_uint("qwen3next.expert_used_count"), 10u);
  EXPECT_EQ(f->get_uint("general.file_type"), 19u);
  EXPECT_EQ(f->find("qwen3next.full_attention_interval"), nullptr);  // absent in model A
  EXPECT_EQ(f->get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(f->get_string("tokenizer.ggml.pre"), "qwen2");
  EXPECT_EQ(f->get("tokenizer.ggml.tokens").size(), 151936u);
  EXPECT_EQ(f->get("tokenizer.ggml.merges").size(), 151387u);
  EXPECT_EQ(f->get("tokenizer.ggml.tokens").str_at(151644), "<|im_start|>");
  EXPECT_EQ(f->get_uint("tokenizer.ggml.bos_token_id"), 151643u);
  EXPECT_FALSE(f->get("tokenizer.ggml.add_bos_token").as_bool());
  EXPECT_NEAR(f->get_float("qwen3next.rope.freq_base"), 1e7, 1e-3);

  EXPECT_EQ(f->tensors().size(), 70u);
  const std::map<std::string, int> expected = {{"f32", 27},  {"f16", 4},   {"q2_K", 1},     {"q4_K", 1},
                                               {"q5_K", 1},  {"q6_K", 1},  {"q8_0", 12},    {"iq2_xxs", 19},
                                               {"iq2_xs", 2}, {"iq1_m", 2}};
  EXPECT_EQ(type_counts(*f), expected);
  expect_tensor(*f, "output.weight", GgmlType::Q5_K, {256, 151936});
  expect_tensor(*f, "token_embd.weight", GgmlType::Q2_K, {256, 151936});
  expect_tensor(*f, "blk.0.ssm_in.weight", GgmlType::IQ2_XXS, {256, 768});
  expect_tensor(*f, "blk.0.ffn_down_exps.weight", GgmlType::IQ2_XS, {256, 256, 64});
  expect_tensor(*f, "blk.2.ffn_gate_exps.weight", GgmlType::IQ1_M, {256, 256, 64});
  expect_tensor(*f, "blk.3.attn_q.weight", GgmlType::IQ2_XXS, {256, 512});
  expect_tensor(*f, "blk.0.ffn_gate_inp_shexp.weight", GgmlType::F16, {256});
  expect_tensor(*f, "blk.1.ssm_conv1d.weight", GgmlType::F32, {4, 512});
  EXPECT_EQ(test::touch_everything(*f), "");
}

TEST(GgufFixtures, ModelBParses) {
  const std::string path = test::fixture("tiny-qwen3next-q4km.gguf");
  RL_REQUIRE_FIXTURE(path);
  auto f = GgufFile::open(path);
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->file_size(), 40977952u);
  EXPECT_EQ(f->get_string("general.architecture"), "qwen3next");
  EXPECT_EQ(f->get_string("general.name"), "Tiny Qwen3 Next Test B");
  EXPECT_EQ(f->get_uint("qwen3next.block_count"), 5u);
  EXPECT_EQ(f->get_uint("qwen3next.nextn_predict_layers"), 1u);
  EXPECT_EQ(f->get_uint("qwen3next.full_attention_interval"), 4u);
  EXPECT_EQ(f->get_uint("general.file_type"), 15u);
  EXPECT_EQ(f->get("tokenizer.ggml.tokens").size(), 4099u);
  EXPECT_EQ(f->get("tokenizer.ggml.merges").size(), 3840u);
  EXPECT_EQ(f->get("tokenizer.ggml.token_type").int_at(4097), 3);
  EXPECT_EQ(f->get_uint("tokenizer.ggml.eos_token_id"), 4096u);
  EXPECT_NE(f->get_string("tokenizer.chat_template").find("<|im_start|>"), std::string::npos);
  // Metadata keeps the file's order.
  EXPECT_EQ(f->metadata().front().key, "general.architecture");
  EXPECT_EQ(f->metadata().back().key, "quantize.imatrix.chunks_count");

  EXPECT_EQ(f->tensors().size(), 93u);
  const std::map<std::string, int> expected = {
      {"f32", 40}, {"q4_K", 40}, {"q5_K", 3}, {"q6_K", 7}, {"q8_0", 3}};
  EXPECT_EQ(type_counts(*f), expected);
  expect_tensor(*f, "output.weight", GgmlType::Q6_K, {256, 4099});
  expect_tensor(*f, "token_embd.weight", GgmlType::Q4_K, {256, 4099});
  expect_tensor(*f, "blk.0.attn_qkv.weight", GgmlType::Q4_K, {256, 512});
  expect_tensor(*f, "blk.2.attn_qkv.weight", GgmlType::Q6_K, {256, 512});
  expect_tensor(*f, "blk.1.attn_gate.weight", GgmlType::Q5_K, {256, 256});
  expect_tensor(*f, "blk.4.nextn.eh_proj.weight", GgmlType::Q4_K, {512, 256});
  expect_tensor(*f, "blk.4.ffn_down_exps.weight", GgmlType::Q6_K, {256, 256, 64});
  expect_tensor(*f, "blk.0.ssm_ba.weight", GgmlType::Q8_0, {256, 8});
  EXPECT_EQ(test::touch_everything(*f), "");
}

TEST(GgufFixtures, QuantZooAndItsReferenceParse) {
  const std::string zoo_path = test::fixture("quant/quant-zoo.gguf");
  const std::string ref_path = test::fixture("quant/quant-zoo.ref.gguf");
  RL_REQUIRE_FIXTURE(zoo_path);
  RL_REQUIRE_FIXTURE(ref_path);
  auto zoo = GgufFile::open(zoo_path);
  auto ref = GgufFile::open(ref_path);
  EXPECT_EQ(zoo->get_string("general.architecture"), "quant-zoo");
  const std::vector<std::string> types = {"f32",  "f16",   "bf16",    "q4_0",   "q4_1",   "q5_0",
                                          "q5_1", "q8_0",  "q2_K",    "q3_K",   "q4_K",   "q5_K",
                                          "q6_K", "iq1_s", "iq1_m",   "iq2_xxs", "iq2_xs", "iq2_s",
                                          "iq3_xxs", "iq3_s", "iq4_nl", "iq4_xs", "mxfp4"};
  EXPECT_EQ(zoo->tensors().size(), types.size());
  EXPECT_EQ(ref->tensors().size(), types.size());
  for (const auto& name : types) {
    SCOPED_TRACE(name);
    const GgufTensorInfo* t = zoo->find_tensor("zoo." + name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(std::string(type_name(t->type)), name);
    EXPECT_EQ(t->ne[0], 1024);
    EXPECT_EQ(t->ne[1], 32);
    EXPECT_EQ(t->nbytes, row_size(t->type, 1024) * 32);
    const GgufTensorInfo* r = ref->find_tensor("zoo." + name);
    ASSERT_NE(r, nullptr);
    EXPECT_EQ(r->type, GgmlType::F32);
    EXPECT_EQ(r->n_elements(), 1024 * 32);
  }
  EXPECT_EQ(test::touch_everything(*zoo), "");
  EXPECT_EQ(test::touch_everything(*ref), "");
}

TEST(GgufFixtures, MissingKeysAndTensorsNameTheFile) {
  const std::string path = test::fixture("tiny-qwen3next-q4km.gguf");
  RL_REQUIRE_FIXTURE(path);
  auto f = GgufFile::open(path);
  try {
    f->get("qwen3next.no_such_key");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("qwen3next.no_such_key"), std::string::npos);
  }
  try {
    f->tensor("blk.9.attn_q.weight");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("blk.9.attn_q.weight"), std::string::npos);
  }
  EXPECT_EQ(f->get_uint("qwen3next.no_such_key", 7), 7u);
  EXPECT_THROW(f->get_uint("general.architecture", 7), Error);  // present with the wrong type
  EXPECT_THROW(GgufFile::open(test::fixture("no-such-file.gguf")), Error);
  EXPECT_THROW(GgufFile::open(test::fixtures_dir()), Error);  // a directory
}

}  // namespace
}  // namespace rl
