// libFuzzer target over constrained decoding (src/generate/json_schema_grammar.*, grammar.*,
// token_constraint.*): the input is a JSON Schema, a zero byte, then bytes that steer a walk of
// the schema's grammar. The schema is parsed as a request's is (parse_json_bounded) and compiled
// (a refusal, rl::Error, ends the case). The walk feeds the steering bytes to the automaton; a
// byte it rejects is replaced by one of the bytes it allows, picked by the rejected value, so the
// walk goes deep into the grammar. Every few steps the allowed-token mask over a small vocabulary
// is computed. Checked: a token the mask allows is accepted, its bytes one by one; the shortest
// completion completes the document (advance succeeds and complete() holds); a complete
// document is never extended by an empty completion that leaves it incomplete.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../generate/fakes.h"
#include "common/error.h"
#include "generate/json_depth.h"
#include "generate/json_schema_grammar.h"
#include "generate/sampler.h"
#include "generate/token_constraint.h"
#include "generate/token_trie.h"

namespace {

[[noreturn]] void finding(const char* what) {
  std::fprintf(stderr, "finding: %s\n", what);
  std::abort();
}

const rl::TokenTrie& trie() {
  static rl::test::FakeTokenizer tokenizer;
  static rl::TokenTrie t(tokenizer);
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input((const char*)data, size);
  const size_t split = input.find('\0');
  const std::string schema_text = input.substr(0, split);
  const std::string steer = split == std::string::npos ? std::string() : input.substr(split + 1);
  std::shared_ptr<const rl::Grammar> grammar;
  try {
    const auto schema = rl::parse_json_bounded<nlohmann::ordered_json>(schema_text);
    grammar = std::make_shared<const rl::Grammar>(rl::json_schema_grammar(schema));
  } catch (const nlohmann::json::exception&) {
    return 0;
  } catch (const rl::TooDeepJson&) {
    return 0;
  } catch (const rl::Error&) {
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "unexpected exception: %s\n", e.what());
    std::abort();
  }
  const rl::TokenTrie& t = trie();
  rl::TokenConstraint c(*grammar, t, false);
  rl::TokenMask mask;
  size_t step = 0;
  for (const char ch : steer) {
    if (step++ % 8 == 0) {
      mask.reset(t.n_vocab());
      c.allowed_tokens(64, mask);
      // The first allowed token that is not an end of generation must be accepted.
      for (int32_t id = 0; id < t.n_vocab(); ++id) {
        if (!mask.allows(id) || t.bytes(id).empty()) continue;
        if (!c.accepts(t.bytes(id))) finding("an allowed token is rejected");
        break;
      }
    }
    char byte = ch;
    if (!c.accepts(std::string_view(&byte, 1))) {
      const rl::ByteSet next = c.next_bytes();
      std::vector<char> options;
      for (int b = 0; b < 256; ++b)
        if (next.has((uint8_t)b)) options.push_back((char)b);
      if (options.empty()) {
        if (!c.complete()) finding("no byte may follow an incomplete document");
        break;
      }
      byte = options[(uint8_t)ch % options.size()];
    }
    if (!c.advance(std::string_view(&byte, 1))) finding("an allowed byte is rejected");
  }
  const std::string completion = c.shortest_completion();
  if (completion.size() != c.distance()) finding("the shortest completion's length is not the distance");
  if (!c.advance(completion)) finding("the shortest completion is rejected");
  if (!c.complete()) finding("the shortest completion leaves the document incomplete");
  return 0;
}
