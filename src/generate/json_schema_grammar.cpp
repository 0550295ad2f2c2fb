#include "generate/json_schema_grammar.h"

#include <set>

#include "common/error.h"
#include "generate/json_string_grammar.h"

namespace rl {

using ojson = nlohmann::ordered_json;
using Sequence = GrammarBuilder::Sequence;

namespace {

// Counts (items, characters) above this are capped: the rules grow with the count.
constexpr int64_t kMaxCount = 4096;
// Deeper schemas and objects with more properties are refused: they bound the compiler's
// recursion and the parses alive at once (every optional property may come next).
constexpr int kMaxDepth = 128;
constexpr size_t kMaxProperties = 1024;

const std::set<std::string>& annotations() {
  static const std::set<std::string> s = {"title",  "description", "default",  "examples",  "$schema", "$id",
                                          "$comment", "deprecated", "readOnly", "writeOnly", "$defs",  "definitions"};
  return s;
}

const std::set<std::string>& supported() {
  static const std::set<std::string> s = {"type",     "properties", "required",  "additionalProperties",
                                          "items",    "minItems",   "maxItems",  "enum",
                                          "const",    "pattern",    "minLength", "maxLength",
                                          "anyOf",    "$ref"};
  return s;
}

// The keywords of `schema` that constrain values (not annotations).
std::vector<std::string> constraining_keys(const ojson& schema) {
  std::vector<std::string> keys;
  for (auto it = schema.begin(); it != schema.end(); ++it)
    if (!annotations().count(it.key())) keys.push_back(it.key());
  return keys;
}

bool has_type(const ojson& v, const std::string& type) {
  if (type == "string") return v.is_string();
  if (type == "integer") return v.is_number_integer() || v.is_number_unsigned();
  if (type == "number") return v.is_number();
  if (type == "boolean") return v.is_boolean();
  if (type == "null") return v.is_null();
  if (type == "object") return v.is_object();
  if (type == "array") return v.is_array();
  return false;
}

int64_t count_keyword(const ojson& schema, const char* key, const std::string& path, int64_t fallback) {
  auto it = schema.find(key);
  if (it == schema.end()) return fallback;
  if (!it->is_number_unsigned() && !(it->is_number_integer() && it->get<int64_t>() >= 0))
    fail("'{}' (at {}) must be a non-negative integer", key, path);
  const uint64_t v = it->get<uint64_t>();
  return v > (uint64_t)1e12 ? (int64_t)1e12 : (int64_t)v;
}

// The bounds of a repetition: a minimum above the cap is refused, a maximum above it capped.
std::pair<int64_t, int64_t> count_bounds(const ojson& schema, const char* min_key, const char* max_key,
                                         const std::string& path) {
  const int64_t lo = count_keyword(schema, min_key, path, 0);
  int64_t hi = count_keyword(schema, max_key, path, -1);
  if (lo > kMaxCount) fail("'{}' (at {}) above {} is not supported", min_key, path, kMaxCount);
  if (hi > std::max(lo, kMaxCount)) hi = std::max(lo, kMaxCount);
  return {lo, hi};
}

}  // namespace

Sequence JsonSchemaCompiler::separator() {
  return concat(concat({GrammarBuilder::rule(whitespace())}, b_.literal(",")), {GrammarBuilder::rule(whitespace())});
}

Sequence JsonSchemaCompiler::braced(char open, uint32_t members, char close) {
  const auto ws = GrammarBuilder::rule(whitespace());
  return concat(concat(b_.literal(std::string(1, open)), {ws, GrammarBuilder::rule(members), ws}),
                b_.literal(std::string(1, close)));
}

uint32_t JsonSchemaCompiler::whitespace() {
  if (ws_ != Grammar::kNever) return ws_;
  const uint32_t indent = b_.repeat({b_.bytes(ByteSet::of(" \t"))}, {}, 0, 20);
  return ws_ = b_.rule_of({{}, b_.literal(" "), concat(b_.literal("\n"), {GrammarBuilder::rule(indent)})});
}

uint32_t JsonSchemaCompiler::free_string() {
  if (free_string_ != Grammar::kNever) return free_string_;
  const uint32_t ch = json_char_rule(b_, string_chars_, /*with_u_escapes=*/true);
  const uint32_t body = b_.repeat({GrammarBuilder::rule(ch)}, {}, 0, -1);
  return free_string_ = b_.rule_of({concat(concat(b_.literal("\""), {GrammarBuilder::rule(body)}), b_.literal("\""))});
}

uint32_t JsonSchemaCompiler::number(bool integer) {
  uint32_t& memo = integer ? integer_ : number_;
  if (memo != Grammar::kNever) return memo;
  const auto digit = b_.bytes(ByteSet().add_range('0', '9'));
  auto digits = [&](int64_t lo, int64_t hi) { return GrammarBuilder::rule(b_.repeat({digit}, {}, lo, hi)); };
  const uint32_t sign = b_.rule_of({{}, b_.literal("-")});
  const uint32_t whole = b_.rule_of({b_.literal("0"), {b_.bytes(ByteSet().add_range('1', '9')), digits(0, 15)}});
  const Sequence int_seq = {GrammarBuilder::rule(sign), GrammarBuilder::rule(whole)};
  if (integer) return memo = b_.rule_of({int_seq});
  const uint32_t frac = b_.rule_of({{}, concat(b_.literal("."), {digits(1, 16)})});
  const uint32_t exp_sign = b_.rule_of({{}, b_.literal("-"), b_.literal("+")});
  const uint32_t exp = b_.rule_of({{}, {b_.bytes(ByteSet::of("eE")), GrammarBuilder::rule(exp_sign), digits(1, 3)}});
  return memo = b_.rule_of({concat(int_seq, {GrammarBuilder::rule(frac), GrammarBuilder::rule(exp)})});
}

uint32_t JsonSchemaCompiler::any_value() {
  if (any_value_ != Grammar::kNever) return any_value_;
  any_value_ = b_.new_rule();  // before its parts: objects and arrays hold values
  const auto ws = GrammarBuilder::rule(whitespace());
  const auto value = GrammarBuilder::rule(any_value_);
  const Sequence member = concat(concat({GrammarBuilder::rule(free_string()), ws}, b_.literal(":")), {ws, value});
  b_.add_alternative(any_value_, braced('{', b_.repeat(member, separator(), 0, -1), '}'));
  b_.add_alternative(any_value_, braced('[', b_.repeat({value}, separator(), 0, -1), ']'));
  b_.add_alternative(any_value_, {GrammarBuilder::rule(free_string())});
  b_.add_alternative(any_value_, {GrammarBuilder::rule(number(false))});
  for (const char* lit : {"true", "false", "null"}) b_.add_alternative(any_value_, b_.literal(lit));
  return any_value_;
}

uint32_t JsonSchemaCompiler::compile(const ojson& schema, const std::string& path) {
  struct DepthGuard {
    int& depth;
    ~DepthGuard() { --depth; }
  } guard{++depth_};
  if (depth_ > kMaxDepth) fail("the schema (at {}) nests deeper than {} levels, $ref included", path, kMaxDepth);
  if (schema.is_boolean()) return schema.get<bool>() ? any_value() : b_.rule_of({});
  if (!schema.is_object()) fail("a schema (at {}) must be an object or a boolean", path);
  const std::vector<std::string> keys = constraining_keys(schema);
  for (const std::string& k : keys)
    if (!supported().count(k))
      fail("the JSON Schema keyword '{}' (at {}) is not supported; supported: type, properties, required, "
           "additionalProperties, items, minItems, maxItems, enum, const, pattern, minLength, maxLength, anyOf, $ref",
           k, path);
  // A composition keyword stands alone: what it would combine with is not enforced.
  for (const char* alone : {"$ref", "anyOf"}) {
    if (!schema.contains(alone)) continue;
    for (const std::string& k : keys)
      if (k != alone) fail("the keyword '{}' next to '{}' (at {}) is not supported", k, alone, path);
  }
  if (auto it = schema.find("$ref"); it != schema.end()) {
    if (!it->is_string()) fail("'$ref' (at {}) must be a string", path);
    return reference(it->get<std::string>(), path);
  }
  if (auto it = schema.find("anyOf"); it != schema.end()) {
    if (!it->is_array() || it->empty()) fail("'anyOf' (at {}) must be a non-empty array", path);
    std::vector<Sequence> alts;
    for (size_t i = 0; i < it->size(); ++i)
      alts.push_back({GrammarBuilder::rule(compile((*it)[i], fmt::format("{}/anyOf/{}", path, i)))});
    return b_.rule_of(std::move(alts));
  }
  for (const char* lit : {"enum", "const"}) {
    if (!schema.contains(lit)) continue;
    for (const std::string& k : keys)
      if (k != lit && k != "type") fail("the keyword '{}' next to '{}' (at {}) is not supported", k, lit, path);
    const ojson values = std::string(lit) == "const" ? ojson::array({schema[lit]}) : schema[lit];
    if (!values.is_array()) fail("'enum' (at {}) must be an array", path);
    return literals(values, schema);
  }
  auto type = schema.find("type");
  if (type == schema.end()) {
    auto any_of = [&](std::initializer_list<const char*> ks) {
      for (const char* k : ks)
        if (schema.contains(k)) return true;
      return false;
    };
    if (any_of({"properties", "required", "additionalProperties"})) return object(schema, path);
    if (any_of({"items", "minItems", "maxItems"})) return array(schema, path);
    if (any_of({"pattern", "minLength", "maxLength"})) return string(schema, path);
    return any_value();
  }
  if (type->is_string()) return typed(schema, type->get<std::string>(), path);
  if (!type->is_array() || type->empty()) fail("'type' (at {}) must be a string or a non-empty array", path);
  std::vector<Sequence> alts;
  for (const ojson& t : *type) {
    if (!t.is_string()) fail("'type' (at {}) must list type names", path);
    alts.push_back({GrammarBuilder::rule(typed(schema, t.get<std::string>(), path))});
  }
  return b_.rule_of(std::move(alts));
}

uint32_t JsonSchemaCompiler::typed(const ojson& schema, const std::string& type, const std::string& path) {
  if (type == "object") return object(schema, path);
  if (type == "array") return array(schema, path);
  if (type == "string") return string(schema, path);
  if (type == "number" || type == "integer") return number(type == "integer");
  if (type == "boolean") return b_.rule_of({b_.literal("true"), b_.literal("false")});
  if (type == "null") return b_.rule_of({b_.literal("null")});
  fail("'type' (at {}): unknown type '{}'", path, type);
}

uint32_t JsonSchemaCompiler::literals(const ojson& values, const ojson& schema) {
  std::vector<std::string> types;
  if (auto t = schema.find("type"); t != schema.end()) {
    if (t->is_string()) types.push_back(t->get<std::string>());
    else if (t->is_array())
      for (const ojson& n : *t)
        if (n.is_string()) types.push_back(n.get<std::string>());
  }
  std::vector<Sequence> alts;
  for (const ojson& v : values) {
    bool typed_ok = types.empty();
    for (const std::string& t : types) typed_ok = typed_ok || has_type(v, t);
    if (typed_ok) alts.push_back(b_.literal(v.dump()));  // compact JSON: what a document may hold
  }
  return b_.rule_of(std::move(alts));  // none left: an empty language, refused by finish()
}

uint32_t JsonSchemaCompiler::reference(const std::string& ref, const std::string& path) {
  if (auto it = refs_.find(ref); it != refs_.end()) return it->second;
  if (ref != "#" && ref.rfind("#/", 0) != 0)
    fail("'$ref' '{}' (at {}): only references into the same schema (\"#/...\") are supported", ref, path);
  const ojson* target = &root_;
  if (ref != "#") {
    try {
      target = &root_.at(ojson::json_pointer(ref.substr(1)));
    } catch (const std::exception&) {
      fail("'$ref' '{}' (at {}) does not resolve", ref, path);
    }
  }
  const uint32_t r = b_.new_rule();  // first: the target may refer to itself
  refs_[ref] = r;
  b_.add_alternative(r, {GrammarBuilder::rule(compile(*target, ref))});
  return r;
}

uint32_t JsonSchemaCompiler::object(const ojson& schema, const std::string& path) {
  const ojson props = schema.value("properties", ojson::object());
  if (!props.is_object()) fail("'properties' (at {}) must be an object", path);
  const ojson additional = schema.value("additionalProperties", ojson(true));
  if (!additional.is_boolean() && !additional.is_object())
    fail("'additionalProperties' (at {}) must be a boolean or a schema", path);
  std::vector<std::pair<std::string, uint32_t>> fields;  // name -> value rule, in order
  std::set<std::string> required;
  if (auto r = schema.find("required"); r != schema.end()) {
    if (!r->is_array()) fail("'required' (at {}) must be an array of names", path);
    for (const ojson& n : *r) {
      if (!n.is_string()) fail("'required' (at {}) must be an array of names", path);
      required.insert(n.get<std::string>());
    }
  }
  if (props.size() + required.size() > kMaxProperties)
    fail("an object (at {}) with more than {} properties is not supported", path, kMaxProperties);
  for (auto it = props.begin(); it != props.end(); ++it)
    fields.emplace_back(it.key(), compile(it.value(), fmt::format("{}/properties/{}", path, it.key())));
  for (const std::string& name : required)  // required but not listed: its value is additionalProperties'
    if (!props.contains(name)) fields.emplace_back(name, compile(additional, path + "/additionalProperties"));

  const auto ws = GrammarBuilder::rule(whitespace());
  if (fields.empty()) {  // a map: any keys, the values of additionalProperties
    if (additional.is_boolean() && !additional.get<bool>()) return b_.rule_of({braced('{', b_.rule_of({{}}), '}')});
    const auto value = GrammarBuilder::rule(compile(additional, path + "/additionalProperties"));
    const Sequence member = concat(concat({GrammarBuilder::rule(free_string()), ws}, b_.literal(":")), {ws, value});
    return b_.rule_of({braced('{', b_.repeat(member, separator(), 0, -1), '}')});
  }
  // rest[e]: the members from field i on, e = whether one was written already (then a comma first).
  std::array<uint32_t, 2> rest = {b_.rule_of({{}}), b_.rule_of({{}})};
  for (size_t i = fields.size(); i-- > 0;) {
    const auto& [name, value] = fields[i];
    const Sequence key = concat(concat(b_.literal("\""), json_string_body(b_, name)), b_.literal("\""));
    const Sequence member = concat(concat(concat(key, {ws}), b_.literal(":")), {ws, GrammarBuilder::rule(value)});
    std::array<uint32_t, 2> here{};
    for (int e = 0; e < 2; ++e) {
      std::vector<Sequence> alts{concat(concat(e ? separator() : Sequence{}, member), {GrammarBuilder::rule(rest[1])})};
      if (!required.count(name)) alts.push_back({GrammarBuilder::rule(rest[e])});
      here[e] = b_.rule_of(std::move(alts));
    }
    rest = here;
  }
  return b_.rule_of({braced('{', rest[0], '}')});
}

uint32_t JsonSchemaCompiler::array(const ojson& schema, const std::string& path) {
  const uint32_t item = schema.contains("items") ? compile(schema["items"], path + "/items") : any_value();
  const auto [lo, hi] = count_bounds(schema, "minItems", "maxItems", path);
  return b_.rule_of({braced('[', b_.repeat({GrammarBuilder::rule(item)}, separator(), lo, hi), ']')});
}

uint32_t JsonSchemaCompiler::string(const ojson& schema, const std::string& path) {
  const Sequence quote = b_.literal("\"");
  if (auto p = schema.find("pattern"); p != schema.end()) {
    if (!p->is_string()) fail("'pattern' (at {}) must be a string", path);
    for (const char* k : {"minLength", "maxLength"})
      if (schema.contains(k)) fail("the keyword '{}' next to 'pattern' (at {}) is not supported", k, path);
    try {
      return b_.rule_of({concat(concat(quote, {GrammarBuilder::rule(regex_rule(b_, p->get<std::string>()))}), quote)});
    } catch (const Error& e) {
      fail("'pattern' (at {}): {}", path, e.what());
    }
  }
  const auto [lo, hi] = count_bounds(schema, "minLength", "maxLength", path);
  if (lo == 0 && hi < 0) return free_string();
  const uint32_t ch = json_char_rule(b_, string_chars_, /*with_u_escapes=*/true);
  return b_.rule_of({concat(concat(quote, {GrammarBuilder::rule(b_.repeat({GrammarBuilder::rule(ch)}, {}, lo, hi))}), quote)});
}

Grammar json_schema_grammar(const ojson& schema) {
  GrammarBuilder b;
  JsonSchemaCompiler c(b, schema);
  const uint32_t root = c.compile(schema, "#");
  return b.finish(root, "the schema");
}

Grammar json_object_grammar() {
  GrammarBuilder b;
  const ojson schema = {{"type", "object"}};
  JsonSchemaCompiler c(b, schema);
  return b.finish(c.compile(schema, "#"), "the schema");
}

}  // namespace rl
