// Constrained decoding (JSON Schema -> grammar -> token masks). The documents are checked by an
// independent validator, Python's json and jsonschema (validate_json.py), never by the engine:
//   - schema errors name the keyword; empty languages are refused;
//   - hand-written documents and rejects, byte by byte;
//   - random walks of the automaton: every prefix it accepts, completed by its shortest
//     completion, is a valid document (so no accepted prefix is a dead end);
//   - the token masks agree with the byte automaton on the real 151,936-token vocabulary;
//   - a random-weight model under each of the corpus' schemas, greedy and sampled, writes valid
//     documents (fixture model A, CPU backend), and max_tokens mid-document ends with "length".
#include <gtest/gtest.h>

#include <chrono>
#include <random>

#include "cpu/cpu_backend.h"
#include "fakes.h"
#include "generate/generator.h"
#include "generate/json_schema_grammar.h"
#include "generate/token_constraint.h"
#include "generate/tool_call_grammar.h"
#include "gguf/gguf.h"
#include "json_constraint_util.h"
#include "model/model.h"
#include "model/session.h"
#include "tokenizer/tokenizer.h"

using namespace rl;
using ojson = nlohmann::ordered_json;

namespace {

constexpr const char* kModelA = "tiny-qwen3next-iq2xxs.gguf";  // the real Qwen2 vocabulary

std::string schema_error(const ojson& schema) {
  try {
    json_schema_grammar(schema);
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

// Whether the automaton accepts `text` whole (as a complete document).
bool accepts_document(const Grammar& g, const TokenTrie& trie, std::string_view text) {
  TokenConstraint c(g, trie, false);
  return c.advance(text) && c.complete();
}
bool accepts_prefix(const Grammar& g, const TokenTrie& trie, std::string_view text) {
  TokenConstraint c(g, trie, false);
  return c.advance(text);
}

const TokenTrie& fake_trie() {
  static test::FakeTokenizer tok;
  static TokenTrie trie(tok);
  return trie;
}

// Skips unless Python's jsonschema is there; else fails with the validator's report.
#define EXPECT_ALL_VALID(cases)                                                      \
  do {                                                                               \
    bool missing = false;                                                            \
    const std::string report = test::python_validate(cases, missing);               \
    if (missing) GTEST_SKIP() << "python3-jsonschema is not installed: " << report; \
    EXPECT_EQ(report, "");                                                           \
  } while (0)

}  // namespace

TEST(JsonSchemaGrammar, UnsupportedKeywordsAreNamed) {
  EXPECT_NE(schema_error({{"type", "integer"}, {"minimum", 3}}).find("'minimum'"), std::string::npos);
  EXPECT_NE(schema_error({{"type", "object"}, {"properties", {{"a", {{"oneOf", ojson::array({true})}}}}}})
                .find("'oneOf' (at #/properties/a)"),
            std::string::npos);
  EXPECT_NE(schema_error({{"type", "string"}, {"format", "email"}}).find("'format'"), std::string::npos);
  EXPECT_NE(schema_error({{"anyOf", ojson::array({true})}, {"type", "string"}}).find("'type' next to 'anyOf'"),
            std::string::npos);
  EXPECT_NE(schema_error({{"$ref", "#/$defs/missing"}}).find("does not resolve"), std::string::npos);
  EXPECT_NE(schema_error({{"$ref", "http://example.com/s.json"}}).find("same schema"), std::string::npos);
  EXPECT_NE(schema_error({{"type", "string"}, {"pattern", "(?=a)b"}}).find("'pattern'"), std::string::npos);
  EXPECT_NE(schema_error({{"type", "string"}, {"pattern", "(a)\\1"}}).find("\\1"), std::string::npos);
  EXPECT_NE(schema_error({{"type", "widget"}}).find("unknown type 'widget'"), std::string::npos);
  EXPECT_EQ(schema_error({{"type", "object"}, {"title", "T"}, {"description", "d"}}), "");
}

// Inputs that would recurse deeply or keep too many parses alive are refused with a message.
TEST(JsonSchemaGrammar, OversizedSchemasAreRefusedNotCrashed) {
  EXPECT_NE(schema_error({{"type", "string"}, {"pattern", std::string(100000, '(') + "a" + std::string(100000, ')')}})
                .find("nested deeper"),
            std::string::npos);
  ojson defs = ojson::object();
  for (int i = 0; i < 5000; ++i) defs["d" + std::to_string(i)] = {{"$ref", "#/$defs/d" + std::to_string(i + 1)}};
  defs["d5000"] = {{"type", "null"}};
  EXPECT_NE(schema_error({{"$defs", defs}, {"$ref", "#/$defs/d0"}}).find("nests deeper than 128"), std::string::npos);
  ojson props = ojson::object();
  for (int i = 0; i < 2000; ++i) props["p" + std::to_string(i)] = {{"type", "null"}};
  EXPECT_NE(schema_error({{"type", "object"}, {"properties", props}}).find("more than 1024 properties"),
            std::string::npos);
  ojson fine = ojson::object();
  for (int i = 0; i < 1000; ++i) fine["p" + std::to_string(i)] = {{"type", "null"}};
  EXPECT_EQ(schema_error({{"type", "object"}, {"properties", fine}}), "");  // 1000 optional members
}

TEST(JsonSchemaGrammar, EmptyLanguagesAreRefused) {
  for (const ojson& s : {ojson(false), ojson{{"enum", ojson::array()}}, ojson{{"type", "string"}, {"enum", {1, 2}}},
                         ojson{{"type", "array"}, {"minItems", 3}, {"maxItems", 2}},
                         ojson{{"type", "object"}, {"properties", {{"a", false}}}, {"required", {"a"}}},
                         ojson{{"type", "object"}, {"required", {"b"}}, {"additionalProperties", false}},
                         ojson{{"$defs", {{"loop", {{"type", "object"}, {"properties", {{"x", {{"$ref", "#/$defs/loop"}}}}},
                                                    {"required", {"x"}}}}}},
                               {"$ref", "#/$defs/loop"}}})
    EXPECT_NE(schema_error(s).find("admits no value"), std::string::npos) << s.dump();
  // A dead branch is dropped, not fatal: the optional property that can never be written.
  EXPECT_EQ(schema_error({{"type", "object"}, {"properties", {{"a", false}, {"b", {{"type", "null"}}}}}}), "");
}

TEST(JsonSchemaGrammar, HandWrittenDocumentsAndRejects) {
  const TokenTrie& trie = fake_trie();
  const Grammar person = json_schema_grammar(ojson::parse(
      R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},"nick":{"type":"string"}},
          "required":["name","age"]})"));
  EXPECT_TRUE(accepts_document(person, trie, R"({"name": "Ann", "age": 31})"));
  EXPECT_TRUE(accepts_document(person, trie, "{\n  \"name\":\"A\\\"b\\u00e9\",\n  \"age\": -0, \"nick\": \"\"\n}"));
  EXPECT_FALSE(accepts_prefix(person, trie, R"({"age")"));             // order: name first
  EXPECT_FALSE(accepts_prefix(person, trie, R"({"name": "Ann", "age": "3)"));
  EXPECT_FALSE(accepts_prefix(person, trie, R"({"name": "Ann"})"));    // age is required
  EXPECT_FALSE(accepts_prefix(person, trie, R"({"name": "Ann", "age": 01)"));
  EXPECT_FALSE(accepts_prefix(person, trie, R"({"name": "Ann", "age": 1.5)"));
  EXPECT_FALSE(accepts_prefix(person, trie, R"({"name": "A)" "\n"));  // raw control character
  EXPECT_FALSE(accepts_prefix(person, trie, R"({"name": "\x)"));       // bad escape
  EXPECT_FALSE(accepts_prefix(person, trie, R"({"name": "\ud800)"));   // surrogate escapes are not written
  EXPECT_FALSE(accepts_prefix(person, trie, "{\"name\": \"\xC3\x28"));  // invalid UTF-8
  EXPECT_FALSE(accepts_prefix(person, trie, R"({"name": "Ann", "age": 3, "x")"));
  EXPECT_FALSE(accepts_document(person, trie, R"({"name": "Ann", "age": 3} )"));

  const Grammar tags = json_schema_grammar(ojson::parse(R"({"type":"array","items":{"enum":["a","b"]},"minItems":1,"maxItems":2})"));
  EXPECT_TRUE(accepts_document(tags, trie, R"(["a", "b"])"));
  EXPECT_FALSE(accepts_prefix(tags, trie, "[]"));
  EXPECT_FALSE(accepts_prefix(tags, trie, R"(["a","b",)"));
  EXPECT_FALSE(accepts_prefix(tags, trie, R"(["c)"));

  const Grammar code = json_schema_grammar(ojson::parse(R"({"type":"string","pattern":"^[A-Z]{2}-\\d+$"})"));
  EXPECT_TRUE(accepts_document(code, trie, R"("AB-123")"));
  EXPECT_FALSE(accepts_prefix(code, trie, R"("A1)"));
  EXPECT_FALSE(accepts_document(code, trie, R"("AB-")"));

  const Grammar list = json_schema_grammar(ojson::parse(
      R"({"$defs":{"n":{"type":"object","properties":{"next":{"anyOf":[{"$ref":"#/$defs/n"},{"type":"null"}]}},"required":["next"]}},"$ref":"#/$defs/n"})"));
  EXPECT_TRUE(accepts_document(list, trie, R"({"next": {"next": {"next": null}}})"));
  EXPECT_FALSE(accepts_prefix(list, trie, R"({"next": {"next": 1)"));

  const Grammar object = json_object_grammar();
  EXPECT_TRUE(accepts_document(object, trie, R"({"a": [1, 2.5e-3, {"b": null}], "c": true})"));
  EXPECT_FALSE(accepts_prefix(object, trie, "["));
  EXPECT_FALSE(accepts_prefix(object, trie, R"({"a": tru )"));
}

// Random walks: at each step a random byte among those the automaton allows; every prefix on
// the way, completed by the engine's shortest completion, must be a valid document.
TEST(JsonSchemaGrammar, EveryAcceptedPrefixCompletesToAValidDocument) {
  const TokenTrie& trie = fake_trie();
  std::mt19937 rng(1234);
  std::vector<test::SchemaCase> cases;
  for (const ojson& schema : test::schema_corpus()) {
    const Grammar g = json_schema_grammar(schema);
    for (int walk = 0; walk < 3; ++walk) {
      TokenConstraint c(g, trie, false);
      std::string prefix;
      for (int step = 0; step < 40; ++step) {
        const ByteSet next = c.next_bytes();
        std::vector<char> options;
        for (int b = 0; b < 256; ++b)
          if (next.has((uint8_t)b)) options.push_back((char)b);
        if (options.empty()) break;
        const char byte = options[rng() % options.size()];
        ASSERT_TRUE(c.advance(std::string_view(&byte, 1)));
        prefix += byte;
        cases.push_back({schema, prefix + c.shortest_completion()});
      }
    }
  }
  ASSERT_GT(cases.size(), 1000u);
  EXPECT_ALL_VALID(cases);
}

namespace {

struct FixtureModel {
  std::shared_ptr<const Model> model;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<TokenTrie> trie;
};

// Model A, opened once for the whole binary (the trie of 151,936 tokens is built once too).
FixtureModel* fixture_model() {
  static std::unique_ptr<FixtureModel> m;
  if (!m && std::filesystem::exists(test::fixture(kModelA))) {
    m = std::make_unique<FixtureModel>();
    m->model = Model::open(test::fixture(kModelA));
    m->backend = cpu::make_cpu_backend(m->model, 2);
    m->tokenizer = Tokenizer::from_gguf(m->model->gguf());
    m->trie = std::make_unique<TokenTrie>(*m->tokenizer);
  }
  return m.get();
}

#define REQUIRE_MODEL_A(m)                 \
  FixtureModel* m = fixture_model();       \
  RL_REQUIRE_FIXTURE(test::fixture(kModelA))

}  // namespace

// The cached, trie-walked masks allow exactly the tokens whose bytes the automaton accepts one by
// one, in states inside strings, numbers, between members, nested, and complete.
TEST(TokenConstraint, MasksEqualTokenByTokenChecksOnTheRealVocabulary) {
  REQUIRE_MODEL_A(m);
  const Grammar g = json_schema_grammar(ojson::parse(
      R"({"type":"object","properties":{"s":{"type":"string"},"n":{"type":"number"},
          "l":{"type":"array","items":{"anyOf":[{"type":"integer"},{"type":"string","enum":["x","yz"]}]}}},
          "required":["s","n","l"]})"));
  for (const char* prefix : {"", "{", R"({"s": "ab)", R"({"s": "ab\)", R"({"s": "", "n": 1)", R"({"s": "", "n": -0.5e)",
                             R"({"s":"","n":2,"l":[)", R"({"s":"","n":2,"l":[1, "y)", R"({"s":"","n":2,"l":[]})"}) {
    TokenConstraint c(g, *m->trie, false);
    ASSERT_TRUE(c.advance(prefix)) << prefix;
    TokenMask mask;
    c.allowed_tokens(1 << 20, mask);
    size_t allowed = 0;
    for (int32_t t = 0; t < m->trie->n_vocab(); ++t) {
      bool expect = false;
      if (!m->trie->bytes(t).empty()) {
        expect = c.accepts(m->trie->bytes(t));
      } else if (m->tokenizer->is_eog(t)) {
        expect = c.complete();
      }
      ASSERT_EQ(mask.allows(t), expect) << "prefix " << prefix << " token " << t << " '" << m->trie->bytes(t) << "'";
      allowed += expect;
    }
    EXPECT_GT(allowed, 0u) << prefix;
  }
}

namespace {

std::vector<int32_t> prompt_tokens(const Tokenizer& tok) {
  return tok.encode("<|im_start|>user\nAnswer in JSON.<|im_end|>\n<|im_start|>assistant\n", true);
}

}  // namespace

// The corpus under a random-weight model, greedy and sampled: every reply is a complete, valid
// document (the budget steers it closed in time), checked by jsonschema.
TEST(TokenConstraint, RandomWeightModelWritesValidDocumentsForEverySchema) {
  REQUIRE_MODEL_A(m);
  auto session = m->backend->new_session(512);
  Generator gen(*session, *m->tokenizer);
  const std::vector<int32_t> prompt = prompt_tokens(*m->tokenizer);
  PromptCache cache(64 << 20);  // the prompt is prefilled once
  std::vector<test::SchemaCase> cases;
  double mask_seconds = 0, waited_seconds = 0;
  int steps = 0;
  for (const ojson& schema : test::schema_corpus()) {
    auto grammar = std::make_shared<const Grammar>(json_schema_grammar(schema));
    for (bool greedy : {true, false}) {
      GenerationConfig cfg;
      // Room for the shortest document written a byte per token, and some more to wander.
      cfg.max_tokens = (int)TokenConstraint(*grammar, *m->trie, false).distance() + 4;
      cfg.sampling.temperature = greedy ? 0.0f : 1.0f;
      cfg.sampling.top_k = greedy ? 0 : 50;
      cfg.sampling.top_p = greedy ? 1.0f : 0.95f;
      cfg.sampling.seed = cases.size() + 1;
      cfg.constraint.grammar = grammar;
      GenerationResult r = gen.generate(prompt, cfg, nullptr, nullptr, &cache);
      EXPECT_EQ(r.finish, FinishReason::Stop) << schema.dump() << " -> " << r.text;
      cases.push_back({schema, r.text});
      mask_seconds += r.constraint_compute_seconds;
      waited_seconds += r.constraint_seconds;
      steps += r.constrained_steps;
    }
  }
  std::printf("[ constraint ] %d steps over %zu replies, masks %.3f ms per token computed, %.3f waited for\n", steps,
              cases.size(), 1e3 * mask_seconds / std::max(steps, 1), 1e3 * waited_seconds / std::max(steps, 1));
  EXPECT_ALL_VALID(cases);
}

// max_tokens inside a document: "length", and what was written is a prefix the automaton accepts.
TEST(TokenConstraint, MaxTokensMidDocumentEndsWithLength) {
  REQUIRE_MODEL_A(m);
  auto session = m->backend->new_session(256);
  Generator gen(*session, *m->tokenizer);
  const ojson schema = ojson::parse(R"({"type":"object","properties":{"long_property_name":{"type":"string","minLength":30}},
                                        "required":["long_property_name"]})");
  auto grammar = std::make_shared<const Grammar>(json_schema_grammar(schema));
  GenerationConfig cfg;
  cfg.max_tokens = 6;
  cfg.sampling.temperature = 0;
  cfg.constraint.grammar = grammar;
  GenerationResult r = gen.generate(prompt_tokens(*m->tokenizer), cfg, nullptr);
  EXPECT_EQ(r.finish, FinishReason::Length);
  EXPECT_EQ(r.tokens.size(), 6u);
  TokenConstraint c(*grammar, *m->trie, false);
  EXPECT_TRUE(c.advance(r.text)) << r.text;
  EXPECT_FALSE(c.complete());
}

// A Thinking reply: free text until </think>, then the document; no end before it is complete.
TEST(TokenConstraint, ReasoningStaysFreeUntilThinkCloses) {
  REQUIRE_MODEL_A(m);
  const Grammar g = json_schema_grammar(ojson::parse(R"({"type":"boolean"})"));
  TokenConstraint c(g, *m->trie, /*after_reasoning=*/true);
  TokenMask mask;
  c.allowed_tokens(100, mask);
  const int32_t plain = m->tokenizer->encode("Hello", false).at(0);
  EXPECT_TRUE(mask.allows(plain));  // free text
  for (int32_t t : m->trie->end_of_generation()) EXPECT_FALSE(mask.allows(t));
  for (int32_t t : m->tokenizer->encode("hmm</think>\n\n", false)) c.accept(t);
  EXPECT_FALSE(c.in_reasoning());
  c.allowed_tokens(100, mask);
  EXPECT_FALSE(mask.allows(plain));
  EXPECT_TRUE(c.advance("tru"));
  EXPECT_FALSE(c.advance("x"));

  // 13 steps left hold "</think>", "true" and the end, and no more: only "</think>" may follow.
  TokenConstraint closing(g, *m->trie, true);
  closing.allowed_tokens(13, mask);
  ASSERT_GT(mask.count(), 0u);
  for (int32_t t = 0; t < m->trie->n_vocab(); ++t)
    if (mask.allows(t)) EXPECT_EQ(std::string_view("</think>").substr(0, m->trie->bytes(t).size()), m->trie->bytes(t));
  closing.allowed_tokens(14, mask);
  EXPECT_TRUE(mask.allows(plain));  // one more step: still free
}

// What a step costs on the real vocabulary: the first visit of a state (a trie walk) and later
// steps in a long string (the cached walk plus the closing-quote tokens walked again).
TEST(TokenConstraint, MaskTimeOnTheRealVocabulary) {
  REQUIRE_MODEL_A(m);
  const Grammar g = json_schema_grammar(ojson::parse(R"({"type":"object","properties":{"text":{"type":"string"}},"required":["text"]})"));
  TokenConstraint c(g, *m->trie, false);
  ASSERT_TRUE(c.advance(R"({"text": "a)"));
  TokenMask mask;
  auto t0 = std::chrono::steady_clock::now();
  c.allowed_tokens(1 << 20, mask);
  const double first = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const size_t allowed = mask.count();
  const size_t first_walks = c.trie_walks();
  const int32_t word = m->tokenizer->encode(" word", false).at(0);
  constexpr int kSteps = 50;
  t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kSteps; ++i) {
    c.allowed_tokens(1 << 20, mask);
    ASSERT_TRUE(mask.allows(word));
    c.accept(word);
  }
  const double later = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / kSteps;
  std::printf("[ constraint ] inside a string: %zu of %d tokens allowed; first step %.2f ms, later steps %.3f ms\n",
              allowed, m->trie->n_vocab(), first * 1e3, later * 1e3);
  EXPECT_GT(allowed, 100000u);  // nearly every token may continue a string
  EXPECT_EQ(c.trie_walks(), first_walks);  // the later steps come from the cache
}

// The tool-call grammars accept exactly the calls the chat templates render (an independent
// writer of the syntax) and that parse_tool_calls reads back; they refuse unknown functions,
// missing required arguments and arguments of the wrong type.
TEST(ToolCallGrammar, AcceptsTheTemplatesCallsAndRefusesBadOnes) {
  const TokenTrie& trie = fake_trie();
  const ojson tools = ojson::parse(R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
      "properties":{"city":{"type":"string"},"days":{"type":"integer"}},"required":["city"]}}}])");
  for (ChatFormat format : {ChatFormat::Qwen3Instruct, ChatFormat::Qwen3Coder}) {
    const Grammar g = tool_call_grammar(tools, format);
    ChatMessage user{"user", "Weather?", {}, {}, {}};
    ChatMessage assistant{"assistant", "", {}, {{"", "get_weather", R"({"city": "Paris <3", "days": 3})"}}, {}};
    const ChatTemplate t = ChatTemplate::of(format);
    const std::vector<ChatMessage> messages = {user, assistant};
    const std::string text = t.render(messages, {.add_generation_prompt = false, .tools = tools});
    const size_t open = text.rfind("<tool_call>"), close = text.find("</tool_call>", open);  // the system turn explains the syntax first
    ASSERT_NE(open, std::string::npos);
    std::string call = text.substr(open, close + 12 - open);
    if (format == ChatFormat::Qwen3Coder) {  // raw string values cannot hold '<' in the grammar
      const size_t lt = call.find(" <3");
      call.erase(lt, 3);
    }
    EXPECT_TRUE(accepts_document(g, trie, call)) << call;
    EXPECT_EQ(t.parse_tool_calls(call, tools).tool_calls.size(), 1u);
    EXPECT_TRUE(accepts_document(g, trie, call + "\n" + call));
    std::string other = call;
    other.replace(other.find("get_weather"), 11, "get_weathex");
    EXPECT_FALSE(accepts_prefix(g, trie, other));
  }
  const Grammar json_form = tool_call_grammar(tools, ChatFormat::Qwen3Instruct);
  EXPECT_FALSE(accepts_prefix(json_form, trie, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"days\""));
  EXPECT_FALSE(accepts_prefix(json_form, trie, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": 1"));
  EXPECT_FALSE(accepts_prefix(json_form, trie, "Sure! <tool_call>"));
  const Grammar xml_form = tool_call_grammar(tools, ChatFormat::Qwen3Coder);
  EXPECT_FALSE(accepts_document(xml_form, trie, "<tool_call>\n<function=get_weather>\n</function>\n</tool_call>"));
  EXPECT_FALSE(accepts_prefix(xml_form, trie, "<tool_call>\n<function=get_weather>\n<parameter=city>\na<"));
  EXPECT_FALSE(accepts_prefix(xml_form, trie,
                              "<tool_call>\n<function=get_weather>\n<parameter=city>\nP\n</parameter>\n<parameter=days>\nx"));
  EXPECT_THROW(tool_call_grammar(tools, ChatFormat::Qwen2), Error);
  EXPECT_THROW(tool_call_grammar(ojson::parse(R"([{"function":{"name":"f","parameters":{"type":"object",
      "properties":{"x":{"anyOf":[{"type":"string"}]}}}}}])"), ChatFormat::Qwen3Coder), Error);
}
