#include "generate/tool_call_grammar.h"

#include <set>

#include "common/error.h"
#include "generate/json_schema_grammar.h"
#include "generate/json_string_grammar.h"

namespace rl {

using ojson = nlohmann::ordered_json;
using Sequence = GrammarBuilder::Sequence;

namespace {

// {"name": "NAME", "arguments": ARGS}
Sequence json_call(GrammarBuilder& b, const std::string& name, const ojson& parameters, const std::string& where) {
  JsonSchemaCompiler compiler(b, parameters);
  const uint32_t args = compiler.compile(parameters, where + ".function.parameters");
  Sequence seq = concat(concat(b.literal("{\"name\": \""), json_string_body(b, name)), b.literal("\", \"arguments\": "));
  return concat(concat(seq, {GrammarBuilder::rule(args)}), b.literal("}"));
}

// <function=NAME>\n then each parameter, then </function>
Sequence coder_call(GrammarBuilder& b, const std::string& name, const ojson& parameters, const std::string& where) {
  const ojson props = parameters.value("properties", ojson::object());
  std::set<std::string> required;
  for (const ojson& r : parameters.value("required", ojson::array()))
    if (r.is_string()) required.insert(r.get<std::string>());
  for (const std::string& r : required)
    if (!props.contains(r)) fail("{}: required parameter '{}' is not among the properties", where, r);
  // No '<' written as itself in a value: "</parameter>" must end it, and nothing before.
  CharClass raw = CharClass::any_char();
  raw.ascii.reset('<');
  JsonSchemaCompiler compiler(b, parameters, raw);
  std::vector<std::pair<bool, Sequence>> params;  // (required, <parameter=P>\nVALUE\n</parameter>\n)
  for (auto it = props.begin(); it != props.end(); ++it) {
    const ojson& p = it.value();
    const std::string at = where + ".function.parameters.properties." + it.key();
    if (it.key().find_first_of("<>") != std::string::npos)
      fail("{}: a parameter name with '<' or '>' cannot be written in the qwen3-coder tool format", at);
    if (!p.is_object() || !p.contains("type") || !p["type"].is_string())
      fail("{}: the qwen3-coder tool format needs a single 'type' for each parameter", at);
    uint32_t value;
    if (p["type"] == "string") {
      std::vector<Sequence> literals;
      for (const char* k : {"enum", "const"})
        if (p.contains(k))
          for (const ojson& v : std::string(k) == "const" ? ojson::array({p[k]}) : p[k])
            if (v.is_string()) literals.push_back(b.literal(v.get<std::string>()));
      for (const char* k : {"pattern", "minLength", "maxLength", "format"})
        if (p.contains(k)) fail("{}: '{}' is not supported in the qwen3-coder tool format", at, k);
      if (p.contains("enum") || p.contains("const")) {
        value = b.rule_of(std::move(literals));
      } else {  // raw text: the parser keeps it verbatim up to </parameter>
        const uint32_t ch = raw_char_rule(b, raw);
        value = b.repeat({GrammarBuilder::rule(ch)}, {}, 0, -1);
      }
    } else {
      value = compiler.compile(p, at);
    }
    Sequence seq = concat(concat(b.literal("<parameter="), b.literal(it.key())), b.literal(">\n"));
    seq = concat(concat(seq, {GrammarBuilder::rule(value)}), b.literal("\n</parameter>\n"));
    params.emplace_back(required.count(it.key()) > 0, std::move(seq));
  }
  // Optional parameters may be left out; the listed order is kept.
  uint32_t rest = b.rule_of({{}});
  for (size_t i = params.size(); i-- > 0;) {
    std::vector<Sequence> alts{concat(params[i].second, {GrammarBuilder::rule(rest)})};
    if (!params[i].first) alts.push_back({GrammarBuilder::rule(rest)});
    rest = b.rule_of(std::move(alts));
  }
  Sequence seq = concat(concat(b.literal("<function="), b.literal(name)), b.literal(">\n"));
  return concat(concat(seq, {GrammarBuilder::rule(rest)}), b.literal("</function>"));
}

}  // namespace

Grammar tool_call_grammar(const ojson& tools, ChatFormat format) {
  const bool xml = format == ChatFormat::Qwen3Coder;
  if (!xml && format != ChatFormat::Qwen3Instruct && format != ChatFormat::Qwen3Thinking &&
      format != ChatFormat::Qwen3Hybrid)
    fail("tool_choice: the {} chat format has no tool calls to require", chat_format_name(format));
  GrammarBuilder b;
  std::vector<Sequence> calls;
  for (size_t i = 0; i < tools.size(); ++i) {
    const ojson& fn = tools[i].contains("function") ? tools[i]["function"] : tools[i];
    const std::string name = fn.value("name", std::string());
    const std::string where = fmt::format("tools[{}] ('{}')", i, name);
    if (xml && name.find_first_of("<>") != std::string::npos)
      fail("{}: a function name with '<' or '>' cannot be written in the qwen3-coder tool format", where);
    ojson parameters = fn.contains("parameters") && fn["parameters"].is_object() ? fn["parameters"]
                                                                                  : ojson{{"type", "object"}};
    try {
      const Sequence body = xml ? coder_call(b, name, parameters, where) : json_call(b, name, parameters, where);
      calls.push_back(concat(concat(b.literal("<tool_call>\n"), body), b.literal("\n</tool_call>")));
    } catch (const Error& e) {
      const std::string msg = e.what();
      fail("{}", msg.rfind("tools[", 0) == 0 ? msg : where + ": " + msg);
    }
  }
  const uint32_t one = b.rule_of(std::move(calls));
  return b.finish(b.repeat({GrammarBuilder::rule(one)}, b.literal("\n"), 1, -1), "the tool calls");
}

}  // namespace rl
