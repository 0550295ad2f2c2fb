// The grammar of a reply that is one or more tool calls, in the syntax of the chat format, so
// that tool_choice "required" (or a named function) is enforced: the model must call one of
// `tools` (the OpenAI list, already narrowed to the allowed ones) with arguments its parameters
// schema accepts.
//
//   Qwen3 (JSON):  <tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call>
//   Qwen3-Coder:   <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n...
//                  </function>\n</tool_call>
//
// Calls follow each other separated by "\n". ARGS is any document of the parameters schema (the
// JSON Schema subset of json_schema_grammar.h). In the Coder form a parameter of type "string"
// is raw text without '<' (the parser keeps it verbatim), one of another type is JSON text of its
// schema; a parameter without a "type" is refused, as the parser could not read it back.
#pragma once
#include <nlohmann/json.hpp>

#include "generate/chat_template.h"
#include "generate/grammar.h"

namespace rl {

// Throws rl::Error naming the tool (and the keyword) when a tool cannot be written as a grammar,
// or the format has no tool calls.
Grammar tool_call_grammar(const nlohmann::ordered_json& tools, ChatFormat format);

}  // namespace rl
