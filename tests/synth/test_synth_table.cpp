// The tensor table synth writes must be exactly the specified one: the 80B seed-mix table against
// the fixture that describes a file llama.cpp loads and runs, and the tiny file as read back by the
// GGUF reader.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <map>
#include <set>

#include "gguf/gguf.h"
#include "quant/quant.h"
#include "synth/synth.h"
#include "test_util.h"

namespace rl::synth {
namespace {

nlohmann::json load_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

std::string temp_path(const std::string& name) { return test::temp_path("synth-test", name); }

// Metadata without the provenance keys synth adds (redlite.synth.*).
nlohmann::json model_metadata(const nlohmann::json& meta) {
  nlohmann::json out = nlohmann::json::object();
  for (auto it = meta.begin(); it != meta.end(); ++it)
    if (it.key().rfind("redlite.synth.", 0) != 0) out[it.key()] = it.value();
  return out;
}

TEST(SynthTable, Preset80bSeedMixEqualsTheFixture) {
  const std::string fixture = test::fixture("80b-seed-mix.tensors.json");
  RL_REQUIRE_FIXTURE(fixture);
  const nlohmann::json want = load_json(fixture);
  Options o;
  o.preset = "80b";
  o.recipe = "seed-mix";
  const nlohmann::json got = plan_json(make_plan(o));

  ASSERT_EQ(got["n_tensors"], want["n_tensors"]);
  ASSERT_EQ(got["tensors"].size(), want["tensors"].size());
  for (size_t i = 0; i < want["tensors"].size(); i++) {
    SCOPED_TRACE("tensor #" + std::to_string(i));
    EXPECT_EQ(got["tensors"][i]["name"], want["tensors"][i]["name"]);
    EXPECT_EQ(got["tensors"][i]["type"], want["tensors"][i]["type"]);
    EXPECT_EQ(got["tensors"][i]["ne"], want["tensors"][i]["ne"]);
  }
  EXPECT_EQ(model_metadata(got["metadata"]), want["metadata"]);
  // The placeholder vocabulary carries the same tokenizer keys (other merges, same sizes of the
  // token arrays and the same control-token ids as the Qwen2 vocabulary).
  for (const auto& key : {"tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
                          "tokenizer.ggml.token_type", "tokenizer.ggml.eos_token_id",
                          "tokenizer.ggml.padding_token_id", "tokenizer.ggml.bos_token_id", "tokenizer.chat_template"})
    EXPECT_EQ(got["tokenizer_keys"][key], want["tokenizer_keys"][key]) << key;
  EXPECT_TRUE(got["tokenizer_keys"].contains("tokenizer.ggml.merges"));
  // With the Qwen2 vocabulary's 151,387 merges the fixture's file is 22,982,503,520 bytes; the
  // tensor data alone is fixed by the table.
  EXPECT_GT(got["data_bytes"].get<uint64_t>(), 22'000'000'000ull);
  EXPECT_LT(got["data_bytes"].get<uint64_t>(), 22'982'503'520ull);
}

// all-types: every one of the 23 ggml types with a float view (the reference dequantisation's
// list) holds at least one weight matrix of the tiny model, in both layouts; the tensors that are
// not matrices stay F32, and no tensor has a type without a float view.
TEST(SynthTable, AllTypesRecipeUsesEveryTypeWithAFloatView) {
  for (ProjectionLayout layout : {ProjectionLayout::LegacyFused, ProjectionLayout::Split}) {
    Options o;
    o.preset = "tiny";
    o.recipe = "all-types";
    o.layout = layout;
    const Plan p = make_plan(o);
    std::set<std::string> used;  // type names, so that a failure lists them readably
    std::map<std::string, GgmlType> type_of;
    for (const auto& t : p.tensors) type_of[t.name] = t.type;
    for (const auto& t : p.tensors) {
      used.insert(type_name(t.type));
      if (const size_t at = t.name.find("ffn_up_"); at != std::string::npos) {  // the gate's type
        EXPECT_EQ(t.type, type_of.at(t.name.substr(0, at) + "ffn_gate_" + t.name.substr(at + 7))) << t.name;
      }
      const bool matrix = t.ne.size() >= 2 && t.name.find("ssm_conv1d") == std::string::npos &&
                          t.name.find("ffn_gate_inp") == std::string::npos;
      if (!matrix) {
        EXPECT_EQ(t.type, GgmlType::F32) << t.name;
      }
    }
    std::set<std::string> want;
    for (uint32_t id = 0; id < 64; id++)
      if (const QuantType* q = find_quant_type(id); q && q->dequantize_row) want.insert(q->name);
    EXPECT_EQ(want.size(), 23u);
    EXPECT_EQ(used, want);
  }
}

TEST(SynthTable, SplitLayoutReplacesSsmIn) {
  Options o;
  o.preset = "80b";
  o.layout = ProjectionLayout::Split;
  const Plan p = make_plan(o);
  int qkv = 0, gate = 0, ssm_in = 0;
  for (const auto& t : p.tensors) {
    if (t.name.find("attn_qkv") != std::string::npos) {
      qkv++;
      EXPECT_EQ(t.ne, (std::vector<int64_t>{2048, 2 * 2048 + 4096}));
    }
    if (t.name.find("attn_gate") != std::string::npos) {
      gate++;
      EXPECT_EQ(t.ne, (std::vector<int64_t>{2048, 4096}));
    }
    ssm_in += t.name.find("ssm_in") != std::string::npos;
  }
  EXPECT_EQ(qkv, 36);
  EXPECT_EQ(gate, 36);
  EXPECT_EQ(ssm_in, 0);
}

TEST(SynthTable, TinyFileReadsBackAsPlanned) {
  Options o;
  o.preset = "tiny";
  o.seed = 7;
  const Plan plan = make_plan(o);
  const std::string path = temp_path("tiny.gguf");
  const WriteStats stats = write_model(plan, path);
  auto f = GgufFile::open(path);
  EXPECT_EQ(f->file_size(), stats.file_bytes);
  EXPECT_LT(stats.file_bytes, 16u << 20);  // "a few MB"

  // Tensors: names, types, shapes and order exactly as planned.
  ASSERT_EQ(f->tensors().size(), plan.tensors.size());
  for (size_t i = 0; i < plan.tensors.size(); i++) {
    const auto& got = f->tensors()[i];
    const auto& want = plan.tensors[i];
    SCOPED_TRACE(want.name);
    EXPECT_EQ(got.name, want.name);
    EXPECT_EQ(got.type, want.type);
    ASSERT_EQ(got.n_dims, want.ne.size());
    for (size_t d = 0; d < want.ne.size(); d++) EXPECT_EQ(got.ne[d], want.ne[d]);
    EXPECT_EQ(got.nbytes, want.n_bytes());
  }
  // Metadata: every planned key with its value, then the tokenizer and the placeholder mark.
  const nlohmann::json meta = plan_json(plan)["metadata"];
  for (auto it = meta.begin(); it != meta.end(); ++it) {
    const GgufValue& v = f->get(it.key());
    if (it.value().is_string()) EXPECT_EQ(v.as_string(), it.value().get<std::string>()) << it.key();
    else if (it.value().is_number_float()) EXPECT_EQ((float)v.as_float(), it.value().get<float>()) << it.key();
    else EXPECT_EQ(v.as_uint(), it.value().get<uint64_t>()) << it.key();
  }
  EXPECT_EQ(f->get_uint("qwen3next.block_count"), 4u);
  EXPECT_EQ(f->get("tokenizer.ggml.tokens").size(), (size_t)plan.dims.n_vocab);
  EXPECT_EQ(f->get("tokenizer.ggml.token_type").size(), (size_t)plan.dims.n_vocab);
  EXPECT_TRUE(f->get("redlite.synth.placeholder_vocab").as_bool());
  EXPECT_EQ(f->get_uint("redlite.synth.seed"), 7u);
  const uint64_t eot = f->get_uint("tokenizer.ggml.eos_token_id");
  EXPECT_EQ(f->get("tokenizer.ggml.tokens").str_at(eot), "<|endoftext|>");
  EXPECT_EQ(f->get("tokenizer.ggml.tokens").str_at(eot + 1), "<|im_start|>");
  EXPECT_EQ(f->get("tokenizer.ggml.tokens").str_at(eot + 2), "<|im_end|>");
  test::remove_temp(path);
}

TEST(SynthTable, SameSeedSameBytesWhateverTheThreadCount) {
  Options o;
  o.preset = "tiny";
  o.seed = 3;
  o.threads = 1;
  const std::string a = temp_path("a.gguf"), b = temp_path("b.gguf"), c = temp_path("c.gguf");
  write_model(make_plan(o), a);
  o.threads = 3;
  write_model(make_plan(o), b);
  o.seed = 4;
  write_model(make_plan(o), c);
  auto read = [](const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return std::vector<char>(std::istreambuf_iterator<char>(in), {});
  };
  const auto ba = read(a), bb = read(b), bc = read(c);
  EXPECT_EQ(ba, bb);
  ASSERT_EQ(ba.size(), bc.size());
  EXPECT_NE(ba, bc);
  test::remove_temp(a), test::remove_temp(b), test::remove_temp(c);
}

TEST(SynthTable, VocabFromCopiesTheTokenizer) {
  const std::string src = test::fixture("tiny-qwen3next-q4km.gguf");
  RL_REQUIRE_FIXTURE(src);
  Options o;
  o.preset = "tiny";
  o.vocab_from = src;
  const Plan plan = make_plan(o);
  EXPECT_EQ(plan.dims.n_vocab, 4099);
  const std::string path = temp_path("vocab.gguf");
  write_model(plan, path);
  auto f = GgufFile::open(path);
  auto ref = GgufFile::open(src);
  int copied = 0;
  for (const auto& kv : ref->metadata()) {
    if (kv.key.rfind("tokenizer.", 0) != 0) continue;
    copied++;
    const GgufValue& got = f->get(kv.key);
    EXPECT_EQ(got.to_string(1000000), kv.value.to_string(1000000)) << kv.key;
  }
  EXPECT_GE(copied, 9);
  EXPECT_FALSE(f->get("redlite.synth.placeholder_vocab").as_bool());
  EXPECT_EQ(f->tensor("token_embd.weight").ne[1], 4099);
  EXPECT_EQ(f->tensor("output.weight").ne[1], 4099);
  test::remove_temp(path);
}

// The written 80B file itself (made on the GPU host: tests/synth/device_check.sh sets
// REDLITE_SYNTH_80B): its table and non-tokenizer metadata, read back by the GGUF reader, equal the
// fixture's.
TEST(SynthFile80b, WrittenFileMatchesTheFixture) {
  const char* path = std::getenv("REDLITE_SYNTH_80B");
  if (!path || !*path) GTEST_SKIP() << "REDLITE_SYNTH_80B not set (an 80B file made by redlite synth)";
  const std::string fixture = test::fixture("80b-seed-mix.tensors.json");
  RL_REQUIRE_FIXTURE(fixture);
  const nlohmann::json want = load_json(fixture);
  auto f = GgufFile::open(path);
  ASSERT_EQ(f->tensors().size(), want["tensors"].size());
  for (size_t i = 0; i < f->tensors().size(); i++) {
    const auto& t = f->tensors()[i];
    const auto& w = want["tensors"][i];
    SCOPED_TRACE(w["name"].get<std::string>());
    EXPECT_EQ(t.name, w["name"].get<std::string>());
    std::string type = type_name(t.type);
    for (auto& c : type) c = (char)std::toupper((unsigned char)c);
    EXPECT_EQ(type, w["type"].get<std::string>());
    std::vector<int64_t> ne(t.ne.begin(), t.ne.begin() + t.n_dims);
    EXPECT_EQ(ne, w["ne"].get<std::vector<int64_t>>());
  }
  int n_model_keys = 0;
  for (const auto& kv : f->metadata()) {
    if (kv.key.rfind("tokenizer.", 0) == 0 || kv.key.rfind("redlite.synth.", 0) == 0) continue;
    n_model_keys++;
    ASSERT_TRUE(want["metadata"].contains(kv.key)) << kv.key;
    const auto& w = want["metadata"][kv.key];
    if (w.is_string()) EXPECT_EQ(kv.value.as_string(), w.get<std::string>()) << kv.key;
    else if (w.is_number_float()) EXPECT_EQ(kv.value.as_float(), w.get<double>()) << kv.key;
    else EXPECT_EQ(kv.value.as_uint(), w.get<uint64_t>()) << kv.key;
  }
  EXPECT_EQ(n_model_keys, (int)want["metadata"].size());
}

}  // namespace
}  // namespace rl::synth
