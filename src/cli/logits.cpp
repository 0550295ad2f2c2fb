// redlite logits: raw little-endian f32 logits of a token sequence, [positions][n_vocab].
#include <cstdio>

#include "cli/command.h"
#include "cli/common_options.h"
#include "common/error.h"

namespace rl::cli {
namespace {

struct LogitsOptions {
  CommonOptions common;
  std::string tokens;
  std::string out;
  bool all_positions = false;
};

int run_logits(const LogitsOptions& o) {
  const std::vector<int32_t> ids = parse_token_ids(o.tokens, "--tokens");
  LoadedModel lm = open_model(o.common);
  auto session = lm.new_session();
  std::vector<float> all;
  std::vector<float> last = session->prefill(ids, o.all_positions ? &all : nullptr);
  const std::vector<float>& data = o.all_positions ? all : last;

  std::FILE* f = std::fopen(o.out.c_str(), "wb");
  if (!f) fail("--out {}: cannot open for writing", o.out);
  const size_t written = std::fwrite(data.data(), sizeof(float), data.size(), f);
  const bool closed = std::fclose(f) == 0;
  if (written != data.size() || !closed) fail("--out {}: write failed", o.out);
  std::fprintf(stderr, "wrote %zu x %d logits (%s backend) to %s\n", o.all_positions ? ids.size() : (size_t)1,
               session->n_vocab(), lm.backend->name().c_str(), o.out.c_str());
  return 0;
}

const Registrar registrar("logits", "write the logits of a token sequence as raw little-endian f32",
                          [](CLI::App& sub) {
                            auto o = std::make_shared<LogitsOptions>();
                            add_common_options(sub, o->common);
                            sub.add_option("--tokens", o->tokens, "token ids, e.g. 1,2,3")->required();
                            sub.add_option("--out", o->out, "output file: [positions][n_vocab] f32")->required();
                            sub.add_flag("--all-positions", o->all_positions,
                                         "every position's logits (default: the last one)");
                            return [o] { return run_logits(*o); };
                          });

}  // namespace
}  // namespace rl::cli
