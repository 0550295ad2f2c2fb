// A chat template as the GGUF file carries it (tokenizer.chat_template), rendered by Red Lite's
// own Jinja interpreter with the Hugging Face chat environment's rules: trim_blocks and
// lstrip_blocks on, loop controls, `tojson` as json.dumps(ensure_ascii=False), the globals
// raise_exception and strftime_now, and jinja2's sandbox refusals (no mutating methods).
//
// Limits, explicit because a template comes from a file and runs per request:
//   - nesting (jinja_ast.h): blocks, parenthesised expressions and macro calls kMaxNestingDepth
//     (64) levels; operator chains at one level kMaxChainLength (256); parsed expression trees
//     kMaxExpressionDepth (256); evaluation at run time kMaxEvalDepth (512) frames, which bounds
//     the C++ stack a render uses. Deeper templates fail to parse, deeper recursion to render;
//   - time: RenderLimits::time_budget (2 s) per render;
//   - size: RenderLimits::max_output_bytes (16 MiB) for the output and for any one string.
// Every limit reached is a JinjaError that says which.
#pragma once
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "generate/jinja_interpreter.h"
#include "generate/jinja_value.h"

namespace rl::jinja {

class JinjaTemplate {
 public:
  // Throws JinjaError (unsupported() true for a construct the interpreter lacks).
  static JinjaTemplate parse(std::string_view source);

  // `context`: a JSON object whose keys become the template's variables (messages, tools,
  // add_generation_prompt, enable_thinking, ...). Throws JinjaError.
  std::string render(const nlohmann::ordered_json& context, const RenderLimits& limits = {}) const;

 private:
  std::shared_ptr<const Body> body_;
};

}  // namespace rl::jinja
