// Parity: reading llama.cpp reference files (fixtures README, "<model>.ref*.json" format) and the
// metrics of DESIGN.md §6 (top-1 agreement, relative RMS error of logits, common greedy prefix,
// router selections). Backend-neutral: anything that implements rl::Session can be measured,
// against a reference file or against another session (GPU vs oracle).
#pragma once
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/argmax.h"  // argmax: the references' greedy rule (ties to the lower index)
#include "model/session.h"

namespace rl {

struct RefPrompt {
  std::string name;
  std::vector<int32_t> token_ids;
  std::vector<int32_t> top1;             // [n_tokens]: reference argmax at every prompt position
  std::vector<float> top1_margin;        // [n_tokens]: its margin over the second logit
  std::vector<int32_t> greedy;           // reference greedy continuation (32 tokens)
  std::vector<float> greedy_margin;      // [greedy.size()]: top1 - top2 at each step
  std::string last_logits_path;          // absolute path of the .last_logits.f32 file
};

struct RefTraceTensor {
  std::string name;
  bool is_i32 = false;
  int n_tokens = 0, width = 0;
  std::vector<float> f32;    // [n_tokens][width] when !is_i32
  std::vector<int32_t> i32;  // [n_tokens][width] when is_i32
};

struct Reference {
  std::string path;
  std::string computation;   // "F32" or "native" (what llama.cpp computed)
  bool is_f32 = false;       // computation on dequantised F32 weights: the oracle's bounds apply
  int n_vocab = 0;
  std::vector<RefPrompt> prompts;
  std::string trace_prompt;  // the prompt the trace belongs to ("short_en"), "" when none
  std::string trace_path;    // absolute path of the .trace.bin file
  std::vector<std::string> trace_names;  // in file order

  const RefPrompt* find_prompt(const std::string& name) const;
  // Reads the trace tensors from trace_path (throws rl::Error when absent or malformed).
  std::map<std::string, RefTraceTensor> load_trace() const;
};

// Reads a reference JSON; throws rl::Error naming the file and the field at fault.
Reference load_reference(const std::string& json_path);
// n little-endian floats from a raw .f32 file; throws when the size differs.
std::vector<float> read_f32_file(const std::string& path, size_t n);

// ‖a − b‖ / ‖b‖ (b is the reference), computed in double.
double relative_rms(std::span<const float> a, std::span<const float> b);
// Length of the common prefix of two token sequences.
int common_prefix(std::span<const int32_t> a, std::span<const int32_t> b);

// The router selections of every MoE layer from a trace ("ffn_moe_topk-L", [n_tokens][k] per
// pass), each layer's passes appended in order: [tokens so far][k] per layer, so two recordings of
// the same tokens line up however their backends split them into passes (the oracle's 512, the
// CUDA backend's --prefill-chunk).
struct SelectionRecorder : TraceSink {
  std::map<std::string, std::vector<int32_t>> by_layer;
  void tensor(std::string_view, int, int, const float*) override {}
  void ids(std::string_view name, int n, int w, const int32_t* d) override;
};
// Selections that differ between two recordings, id by id within each layer; an id or a layer
// one recording lacks counts as differing.
int count_selection_mismatches(const SelectionRecorder& a, const SelectionRecorder& b);

// Prefills `tokens` from the session's current state in chunks of `chunk` tokens and returns the
// argmax at every position; `last_logits` receives the logits of the last position. Chunking keeps
// memory at chunk * n_vocab floats even for long prompts and a 152k vocabulary.
std::vector<int32_t> prefill_argmax(Session& s, std::span<const int32_t> tokens, int chunk,
                                    std::vector<float>* last_logits);
// Real greedy decoding (each step feeds back its own argmax): n tokens after `first_logits`.
std::vector<int32_t> greedy_continue(Session& s, std::span<const float> first_logits, int n);

// One prompt measured against a reference.
struct PromptParity {
  std::string name;
  int n_tokens = 0;
  int top1_agree = 0;        // prompt positions whose argmax equals the reference's
  int first_top1_mismatch = -1;
  double last_rel_rms = 0;   // relative RMS error of the last prompt position's logits
  double last_max_abs = 0;   // max |a - b| over the same logits
  int greedy_common = 0;     // common prefix with the reference continuation
  int greedy_len = 0;
  std::vector<int32_t> greedy;  // what the session generated
  double top1_agreement() const { return n_tokens ? (double)top1_agree / n_tokens : 1.0; }
};

// Bounds for a computation on dequantised weights vs an F32 reference (DESIGN.md §6).
constexpr double kParityMaxRelRms = 1e-4;
bool parity_passes(const PromptParity& p);

// The fast tier's accuracy bar (docs/cpu-fast.md): over a set of prompts, top-1 agreement with the
// F32 reference over every prompt position and the last position's relative RMS error averaged
// over the prompts. The bar is what llama.cpp's own native path (quantised activations, the
// `.ref.json` files) scores against its F32 path on the same prompts.
struct TierAccuracy {
  int n_prompts = 0;
  int n_positions = 0;
  int top1_agree = 0;
  double mean_last_rel_rms = 0;
  double top1_agreement() const { return n_positions ? (double)top1_agree / n_positions : 1.0; }
  // At least the bar's agreement and at most its error.
  bool meets(const TierAccuracy& bar) const {
    return top1_agreement() >= bar.top1_agreement() && mean_last_rel_rms <= bar.mean_last_rel_rms;
  }
};
// A session's figures from its results against the F32 reference.
TierAccuracy tier_accuracy(std::span<const PromptParity> prompts);
// llama.cpp's native reference scored against the F32 reference on the named prompts (both files
// of one model; throws rl::Error when a prompt is missing or its tokens differ).
TierAccuracy native_accuracy(const Reference& f32, const Reference& native, std::span<const std::string> prompts);
// The native reference beside an F32 one: "<model>.ref-f32.json" -> "<model>.ref.json".
std::string native_reference_path(const std::string& f32_path);

// What a session computed for one prompt, from a reset state.
struct PromptRun {
  std::vector<int32_t> top1;         // [n_tokens] argmax at every prompt position
  std::vector<float> last_logits;    // [n_vocab] of the last prompt position
  std::vector<int32_t> greedy;       // real greedy continuation
};
// Resets the session, prefills in chunks of `chunk`, then decodes n_greedy tokens greedily.
PromptRun run_prompt(Session& s, std::span<const int32_t> tokens, int n_greedy, int chunk = 256);
// Scores a run against a reference prompt (reads its .last_logits.f32 file).
PromptParity score_prompt(const PromptRun& run, const RefPrompt& ref, int n_vocab);
// run_prompt + score_prompt with the reference's tokens and continuation length.
PromptParity measure_prompt(Session& s, const RefPrompt& ref, int n_vocab, int chunk = 256);

// Records every traced tensor of a pass (the chunks of a split prefill are concatenated).
class RecordingTrace final : public TraceSink {
 public:
  void tensor(std::string_view name, int n_tokens, int width, const float* data) override;
  void ids(std::string_view name, int n_tokens, int width, const int32_t* data) override;
  std::map<std::string, RefTraceTensor> tensors;
};

// One traced tensor compared with the reference: relative RMS for f32 tensors, the number of
// tokens whose id row differs for i32 (router top-k) tensors.
struct TraceDiff {
  std::string name;
  bool is_i32 = false;
  double rel_rms = 0;
  int rows_differing = 0;
  bool missing = false;  // not recorded, or recorded with another shape
};
// Every tensor of `want` (reference order by name) against `got`.
std::vector<TraceDiff> compare_trace(const std::map<std::string, RefTraceTensor>& got,
                                     const std::map<std::string, RefTraceTensor>& want);

}  // namespace rl
