// JSON Schema -> Grammar: the documents a schema accepts, as the byte grammar TokenConstraint
// enforces. The subset is the one OpenAI's structured outputs accept:
//
//   type (one or a list), properties / required / additionalProperties, items / minItems /
//   maxItems, enum, const, string pattern / minLength / maxLength, anyOf, $ref into the same
//   document ("#", "#/$defs/...", "#/definitions/..."), and annotations (title, description,
//   default, examples, $schema, $id, $comment, deprecated, readOnly, writeOnly).
//
// Any other keyword is refused with an rl::Error naming it and where it is. The grammar may
// describe fewer documents than the schema, never more: an object carries only its listed
// properties (in the listed order), numbers have at most 16 digits before and after the point,
// whitespace is at most a newline and 20 spaces or tabs, counts above 4096 are capped.
#pragma once
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "generate/grammar.h"
#include "generate/json_string_grammar.h"

namespace rl {

// Writes the rules of one schema document into a builder; `root` is what "#" refers to.
class JsonSchemaCompiler {
 public:
  // string_chars: the characters strings may hold as themselves (others only as \u escapes);
  // all by default.
  JsonSchemaCompiler(GrammarBuilder& b, const nlohmann::ordered_json& root, CharClass string_chars = CharClass::any_char())
      : b_(b), root_(root), string_chars_(std::move(string_chars)) {}

  // The rule of the values `schema` accepts; `path` names it in errors ("#/properties/a").
  uint32_t compile(const nlohmann::ordered_json& schema, const std::string& path);
  uint32_t any_value();    // any JSON value
  uint32_t free_string();  // any JSON string, quotes included
  uint32_t whitespace();   // "", " ", or "\n" and up to 20 spaces/tabs

 private:
  uint32_t typed(const nlohmann::ordered_json& schema, const std::string& type, const std::string& path);
  uint32_t object(const nlohmann::ordered_json& schema, const std::string& path);
  uint32_t array(const nlohmann::ordered_json& schema, const std::string& path);
  uint32_t string(const nlohmann::ordered_json& schema, const std::string& path);
  uint32_t number(bool integer);
  uint32_t literals(const nlohmann::ordered_json& values, const nlohmann::ordered_json& schema);
  uint32_t reference(const std::string& ref, const std::string& path);
  // members: "{" ws (MEMBER (ws "," ws MEMBER)*)? ws "}" around a rule of the members.
  GrammarBuilder::Sequence braced(char open, uint32_t members, char close);
  GrammarBuilder::Sequence separator();

  GrammarBuilder& b_;
  const nlohmann::ordered_json& root_;
  CharClass string_chars_;
  std::map<std::string, uint32_t> refs_;  // "$ref" text -> rule
  uint32_t any_value_ = Grammar::kNever, free_string_ = Grammar::kNever, ws_ = Grammar::kNever;
  uint32_t number_ = Grammar::kNever, integer_ = Grammar::kNever;
  int depth_ = 0;  // compile() calls in progress: $ref chains are bounded too
};

// The grammar of the documents `schema` accepts (throws rl::Error: a keyword outside the subset,
// or a schema no document satisfies).
Grammar json_schema_grammar(const nlohmann::ordered_json& schema);
// Any JSON object: response_format {"type": "json_object"}.
Grammar json_object_grammar();

}  // namespace rl
