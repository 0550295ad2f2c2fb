// The values a chat template computes with, and their Python behaviour: Jinja as Hugging Face
// runs it is Python, so truthiness, equality, str(), repr() and json.dumps here follow Python's
// rules (the template output must match jinja2 byte for byte).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.h"

namespace rl::jinja {

// A template error. `unsupported` marks a construct this interpreter does not implement (the
// caller may fall back to a native renderer); other errors are the template's own failures
// (raise_exception, a type error, an undefined attribute) or a limit reached.
struct JinjaError : Error {
  JinjaError(std::string what, bool unsupported_construct = false)
      : Error(std::move(what)), unsupported(unsupported_construct) {}
  bool unsupported;
};

struct Value;
using Array = std::vector<Value>;
using Kwargs = std::vector<std::pair<std::string, Value>>;
struct Object;
class Interpreter;
using NativeFn = std::function<Value(Interpreter&, std::vector<Value>& args, Kwargs& kwargs)>;

struct Callable {
  std::string name;
  NativeFn fn;
};

enum class Kind { Undefined, None, Bool, Int, Float, String, Array, Object, Namespace, Callable };

struct Value {
  Kind kind = Kind::Undefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;                   // String; for Undefined, the name that was looked up
  std::shared_ptr<Array> arr;      // Array (shared, as Python lists are references)
  bool is_tuple = false;           // Array: a Python tuple (dict items, literals), printed (a, b)
  std::shared_ptr<Object> obj;     // Object and Namespace
  std::shared_ptr<Callable> fn;    // Callable

  static Value undefined(std::string name = {}) { Value v; v.s = std::move(name); return v; }
  static Value none() { Value v; v.kind = Kind::None; return v; }
  static Value boolean(bool x) { Value v; v.kind = Kind::Bool; v.b = x; return v; }
  static Value integer(int64_t x) { Value v; v.kind = Kind::Int; v.i = x; return v; }
  static Value number(double x) { Value v; v.kind = Kind::Float; v.f = x; return v; }
  static Value string(std::string x) { Value v; v.kind = Kind::String; v.s = std::move(x); return v; }
  static Value array(Array a = {});
  static Value tuple(Array a) { Value v = array(std::move(a)); v.is_tuple = true; return v; }
  static Value object();
  static Value namespace_object();
  static Value callable(std::string name, NativeFn fn);

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_string() const { return kind == Kind::String; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float || kind == Kind::Bool; }
  bool is_mapping() const { return kind == Kind::Object; }
  double as_double() const { return kind == Kind::Float ? f : kind == Kind::Bool ? (b ? 1 : 0) : (double)i; }
};

// A dict: keys keep insertion order, as Python's do (tojson and `items` depend on it).
struct Object {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(std::string_view key) const;
  void set(const std::string& key, Value v);
};

Value from_json(const nlohmann::ordered_json& j);
// Throws JinjaError for what json.dumps refuses (undefined, macros).
nlohmann::ordered_json to_json(const Value& v);

const char* type_name(const Value& v);  // Python's name for the type, for error messages
bool truthy(const Value& v);
bool equal(const Value& a, const Value& b);
std::string py_str(const Value& v);   // str(v); undefined is ""
std::string py_repr(const Value& v);  // repr(v)

// Unicode code points of UTF-8 text, for len(), indexing and slicing as Python counts them.
std::vector<std::string_view> code_points(std::string_view s);

}  // namespace rl::jinja
