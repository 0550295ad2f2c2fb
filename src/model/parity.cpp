#include "model/parity.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "common/error.h"

namespace rl {

namespace {

using json = nlohmann::json;

const json& field(const json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end()) fail("{}: missing field '{}'", where, key);
  return *it;
}

std::string sibling(const std::string& json_path, const std::string& file) {
  return (std::filesystem::path(json_path).parent_path() / file).string();
}

}  // namespace

const RefPrompt* Reference::find_prompt(const std::string& name) const {
  for (const RefPrompt& p : prompts)
    if (p.name == name) return &p;
  return nullptr;
}

Reference load_reference(const std::string& json_path) {
  std::ifstream in(json_path);
  if (!in) fail("{}: cannot open reference file", json_path);
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    fail("{}: not valid JSON: {}", json_path, e.what());
  }
  Reference r;
  r.path = json_path;
  try {
    r.computation = field(j, "computation", json_path).get<std::string>();
    r.is_f32 = json_path.find("ref-f32") != std::string::npos ||
               r.computation.find("an F32 copy") != std::string::npos;
    r.n_vocab = field(j, "n_vocab", json_path).get<int>();
    for (const json& p : field(j, "prompts", json_path)) {
      RefPrompt rp;
      rp.name = field(p, "name", json_path).get<std::string>();
      const std::string where = json_path + ": prompt " + rp.name;
      rp.token_ids = field(p, "token_ids", where).get<std::vector<int32_t>>();
      for (const json& pos : field(p, "positions", where)) {
        rp.top1.push_back(field(pos, "top", where).at(0).at(0).get<int32_t>());
        rp.top1_margin.push_back(field(pos, "margin_top1_top2", where).get<float>());
      }
      if (rp.top1.size() != rp.token_ids.size())
        fail("{}: {} positions for {} tokens", where, rp.top1.size(), rp.token_ids.size());
      const json& g = field(p, "greedy", where);
      rp.greedy = field(g, "tokens", where).get<std::vector<int32_t>>();
      for (const json& s : field(g, "steps", where))
        rp.greedy_margin.push_back(field(s, "margin_top1_top2", where).get<float>());
      rp.last_logits_path = sibling(json_path, field(p, "last_logits_file", where).get<std::string>());
      r.prompts.push_back(std::move(rp));
    }
    if (auto t = j.find("trace"); t != j.end() && t->is_object()) {
      r.trace_prompt = field(*t, "prompt", json_path).get<std::string>();
      r.trace_path = sibling(json_path, field(*t, "file", json_path).get<std::string>());
      for (const json& e : field(*t, "tensors", json_path)) r.trace_names.push_back(e.at("name"));
    }
  } catch (const json::exception& e) {
    fail("{}: unexpected reference format: {}", json_path, e.what());
  }
  return r;
}

std::map<std::string, RefTraceTensor> Reference::load_trace() const {
  if (trace_path.empty()) fail("{}: the reference has no trace", path);
  std::ifstream jin(path);
  const json j = json::parse(jin);
  std::ifstream bin(trace_path, std::ios::binary);
  if (!bin) fail("{}: cannot open trace file", trace_path);
  std::map<std::string, RefTraceTensor> out;
  for (const json& e : j.at("trace").at("tensors")) {
    RefTraceTensor t;
    t.name = e.at("name").get<std::string>();
    t.is_i32 = e.at("dtype").get<std::string>() == "i32";
    t.n_tokens = e.at("shape").at(0).get<int>();
    t.width = e.at("shape").at(1).get<int>();
    const size_t n = (size_t)t.n_tokens * t.width;
    if (e.at("nbytes").get<size_t>() != n * 4) fail("{}: tensor {} has an inconsistent size", trace_path, t.name);
    bin.seekg(e.at("offset").get<std::streamoff>());
    if (t.is_i32) {
      t.i32.resize(n);
      bin.read(reinterpret_cast<char*>(t.i32.data()), (std::streamsize)(n * 4));
    } else {
      t.f32.resize(n);
      bin.read(reinterpret_cast<char*>(t.f32.data()), (std::streamsize)(n * 4));
    }
    if (!bin) fail("{}: tensor {} runs past the end of the file", trace_path, t.name);
    out[t.name] = std::move(t);
  }
  return out;
}

std::vector<float> read_f32_file(const std::string& path, size_t n) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) fail("{}: cannot open", path);
  const auto size = (size_t)in.tellg();
  if (size != n * sizeof(float)) fail("{}: {} bytes, expected {} ({} floats)", path, size, n * 4, n);
  std::vector<float> v(n);
  in.seekg(0);
  in.read(reinterpret_cast<char*>(v.data()), (std::streamsize)size);
  return v;
}

void SelectionRecorder::ids(std::string_view name, int n, int w, const int32_t* d) {
  if (name.rfind("ffn_moe_topk", 0) != 0) return;
  std::vector<int32_t>& layer = by_layer[std::string(name)];
  layer.insert(layer.end(), d, d + (size_t)n * w);
}

int count_selection_mismatches(const SelectionRecorder& a, const SelectionRecorder& b) {
  static const std::vector<int32_t> none;
  auto layer_of = [](const SelectionRecorder& r, const std::string& name) -> const std::vector<int32_t>& {
    const auto it = r.by_layer.find(name);
    return it == r.by_layer.end() ? none : it->second;
  };
  std::vector<std::string> names;
  for (const auto* r : {&a, &b})
    for (const auto& [name, ids] : r->by_layer) names.push_back(name);
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  int n = 0;
  for (const std::string& name : names) {
    const std::vector<int32_t>&x = layer_of(a, name), &y = layer_of(b, name);
    const size_t len = std::min(x.size(), y.size());
    for (size_t j = 0; j < len; j++) n += x[j] != y[j];
    n += (int)(std::max(x.size(), y.size()) - len);
  }
  return n;
}

double relative_rms(std::span<const float> a, std::span<const float> b) {
  if (a.size() != b.size()) fail("relative_rms: sizes differ ({} vs {})", a.size(), b.size());
  double diff = 0, ref = 0;
  for (size_t i = 0; i < a.size(); i++) {
    const double d = (double)a[i] - (double)b[i];
    diff += d * d;
    ref += (double)b[i] * b[i];
  }
  return ref > 0 ? std::sqrt(diff / ref) : std::sqrt(diff);
}

int common_prefix(std::span<const int32_t> a, std::span<const int32_t> b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) n++;
  return (int)n;
}

std::vector<int32_t> prefill_argmax(Session& s, std::span<const int32_t> tokens, int chunk,
                                    std::vector<float>* last_logits) {
  if (chunk <= 0) chunk = 1;
  const size_t n_vocab = (size_t)s.n_vocab();
  std::vector<int32_t> top1;
  std::vector<float> logits;
  for (size_t begin = 0; begin < tokens.size(); begin += chunk) {
    const size_t n = std::min(tokens.size() - begin, (size_t)chunk);
    s.prefill(tokens.subspan(begin, n), &logits);
    for (size_t i = 0; i < n; i++) top1.push_back(argmax(std::span(logits).subspan(i * n_vocab, n_vocab)));
    if (last_logits && begin + n == tokens.size())
      last_logits->assign(logits.end() - (std::ptrdiff_t)n_vocab, logits.end());
  }
  return top1;
}

std::vector<int32_t> greedy_continue(Session& s, std::span<const float> first_logits, int n) {
  std::vector<int32_t> out;
  std::vector<float> logits(first_logits.begin(), first_logits.end());
  for (int i = 0; i < n; i++) {
    out.push_back(argmax(logits));
    if (i + 1 < n) logits = s.decode(out.back());
  }
  return out;
}

bool parity_passes(const PromptParity& p) {
  return p.last_rel_rms <= kParityMaxRelRms && p.top1_agree == p.n_tokens &&
         p.greedy_common == p.greedy_len;
}

PromptRun run_prompt(Session& s, std::span<const int32_t> tokens, int n_greedy, int chunk) {
  PromptRun run;
  s.reset();
  run.top1 = prefill_argmax(s, tokens, chunk, &run.last_logits);
  run.greedy = greedy_continue(s, run.last_logits, n_greedy);
  return run;
}

PromptParity score_prompt(const PromptRun& run, const RefPrompt& ref, int n_vocab) {
  PromptParity r;
  r.name = ref.name;
  r.n_tokens = (int)ref.token_ids.size();
  if (run.top1.size() != ref.top1.size()) fail("score_prompt: {} positions for prompt {}", run.top1.size(), ref.name);
  for (int i = 0; i < r.n_tokens; i++) {
    if (run.top1[i] == ref.top1[i])
      r.top1_agree++;
    else if (r.first_top1_mismatch < 0)
      r.first_top1_mismatch = i;
  }
  const std::vector<float> want = read_f32_file(ref.last_logits_path, (size_t)n_vocab);
  r.last_rel_rms = relative_rms(run.last_logits, want);
  for (size_t i = 0; i < want.size(); i++)
    r.last_max_abs = std::max(r.last_max_abs, (double)std::fabs(run.last_logits[i] - want[i]));
  r.greedy_len = (int)ref.greedy.size();
  r.greedy = run.greedy;
  r.greedy_common = common_prefix(run.greedy, ref.greedy);
  return r;
}

PromptParity measure_prompt(Session& s, const RefPrompt& ref, int n_vocab, int chunk) {
  return score_prompt(run_prompt(s, ref.token_ids, (int)ref.greedy.size(), chunk), ref, n_vocab);
}

TierAccuracy tier_accuracy(std::span<const PromptParity> prompts) {
  TierAccuracy a;
  for (const PromptParity& p : prompts) {
    a.n_prompts++;
    a.n_positions += p.n_tokens;
    a.top1_agree += p.top1_agree;
    a.mean_last_rel_rms += p.last_rel_rms;
  }
  if (a.n_prompts) a.mean_last_rel_rms /= a.n_prompts;
  return a;
}

TierAccuracy native_accuracy(const Reference& f32, const Reference& native, std::span<const std::string> prompts) {
  if (native.n_vocab != f32.n_vocab)
    fail("{}: n_vocab {} differs from {}'s {}", native.path, native.n_vocab, f32.path, f32.n_vocab);
  std::vector<PromptParity> scored;
  for (const std::string& name : prompts) {
    const RefPrompt* want = f32.find_prompt(name);
    const RefPrompt* got = native.find_prompt(name);
    if (!want || !got) fail("prompt '{}' is missing from {}", name, want ? native.path : f32.path);
    if (got->token_ids != want->token_ids) fail("prompt '{}': the tokens of {} and {} differ", name, native.path, f32.path);
    PromptRun run;
    run.top1 = got->top1;
    run.last_logits = read_f32_file(got->last_logits_path, (size_t)native.n_vocab);
    run.greedy = got->greedy;
    scored.push_back(score_prompt(run, *want, f32.n_vocab));
  }
  return tier_accuracy(scored);
}

std::string native_reference_path(const std::string& f32_path) {
  const std::string tag = ".ref-f32.json";
  if (f32_path.size() < tag.size() || f32_path.compare(f32_path.size() - tag.size(), tag.size(), tag) != 0)
    fail("{}: not an F32 reference file name (<model>.ref-f32.json); give the native one with --native-ref", f32_path);
  return f32_path.substr(0, f32_path.size() - tag.size()) + ".ref.json";
}

void RecordingTrace::tensor(std::string_view name, int n_tokens, int width, const float* data) {
  RefTraceTensor& t = tensors[std::string(name)];
  t.name = name;
  t.width = width;
  t.n_tokens += n_tokens;
  t.f32.insert(t.f32.end(), data, data + (size_t)n_tokens * width);
}

void RecordingTrace::ids(std::string_view name, int n_tokens, int width, const int32_t* data) {
  RefTraceTensor& t = tensors[std::string(name)];
  t.name = name;
  t.is_i32 = true;
  t.width = width;
  t.n_tokens += n_tokens;
  t.i32.insert(t.i32.end(), data, data + (size_t)n_tokens * width);
}

std::vector<TraceDiff> compare_trace(const std::map<std::string, RefTraceTensor>& got,
                                     const std::map<std::string, RefTraceTensor>& want) {
  std::vector<TraceDiff> out;
  for (const auto& [name, w] : want) {
    TraceDiff d;
    d.name = name;
    d.is_i32 = w.is_i32;
    auto it = got.find(name);
    if (it == got.end() || it->second.is_i32 != w.is_i32 || it->second.n_tokens != w.n_tokens ||
        it->second.width != w.width) {
      d.missing = true;
    } else if (w.is_i32) {
      for (int t = 0; t < w.n_tokens; t++)
        if (!std::equal(w.i32.begin() + (size_t)t * w.width, w.i32.begin() + (size_t)(t + 1) * w.width,
                        it->second.i32.begin() + (size_t)t * w.width))
          d.rows_differing++;
    } else {
      d.rel_rms = relative_rms(it->second.f32, w.f32);
    }
    out.push_back(d);
  }
  return out;
}

}  // namespace rl
