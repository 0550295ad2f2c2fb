// redlite tokenize: the token ids of a text with the model's tokenizer (the same ids llama.cpp
// gives), or, with --json, the ids with the text of each token.
//   redlite tokenize -m MODEL [--special] [--json] [--] TEXT
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/command.h"
#include "common/error.h"
#include "common/format.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace rl::cli {
namespace {

struct TokenizeArgs {
  std::string model_path;
  std::string text;
  bool parse_special = false;
  bool json = false;
};

int run_tokenize(const TokenizeArgs& a) {
  if (a.model_path.empty()) fail("-m/--model: a GGUF model file is required");
  const auto file = GgufFile::open(a.model_path);
  const auto tok = Tokenizer::from_gguf(*file);
  const std::vector<int32_t> ids = tok->encode(a.text, a.parse_special);
  if (!a.json) {
    std::string line;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i) line += ' ';
      line += std::to_string(ids[i]);
    }
    std::printf("%s\n", line.c_str());
    return 0;
  }
  nlohmann::json out;
  out["n_tokens"] = ids.size();
  out["ids"] = ids;
  out["pieces"] = nlohmann::json::array();
  out["pieces_hex"] = nlohmann::json::array();
  for (int32_t id : ids) {
    const std::string p = tok->piece(id);
    out["pieces"].push_back(p);  // a piece may be part of a character: see pieces_hex
    out["pieces_hex"].push_back(to_hex(p));
  }
  // A token can end inside a multi-byte character; such bytes print as U+FFFD in "pieces".
  std::printf("%s\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  return 0;
}

const Registrar registrar("tokenize", "print the token ids of a text (llama.cpp-identical tokenization)",
                          [](CLI::App& sub) -> std::function<int()> {
                            auto a = std::make_shared<TokenizeArgs>();
                            sub.add_option("-m,--model", a->model_path, "GGUF model file (required)");
                            sub.add_flag("--special", a->parse_special,
                                         "parse control tokens such as <|im_start|> written in the text");
                            sub.add_flag("--json", a->json, "print JSON with ids, pieces and pieces_hex");
                            sub.add_option("text", a->text, "text to tokenize (put it after -- if it starts with -)")
                                ->required();
                            return [a] { return run_tokenize(*a); };
                          });

}  // namespace
}  // namespace rl::cli
