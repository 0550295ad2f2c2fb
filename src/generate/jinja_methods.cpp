// Methods of str, dict and list that templates call (`content.split('</think>')`,
// `message.get('x')`). The Hugging Face environment is jinja2's immutable sandbox, so methods
// that modify a list or dict are refused there, and here.
#include <algorithm>

#include <fmt/format.h>

#include "generate/jinja_builtins.h"
#include "generate/jinja_interpreter.h"
#include "generate/jinja_strings.h"

namespace rl::jinja {

namespace {

const char* kStrMethods[] = {"startswith", "endswith", "strip", "lstrip", "rstrip", "split", "rsplit",
                             "splitlines", "replace", "lower", "upper", "title", "capitalize", "find",
                             "rfind", "count", "join", "isdigit", "isalpha", "isalnum", "isspace",
                             "islower", "isupper", "removeprefix", "removesuffix", "format"};
const char* kDictMethods[] = {"items", "keys", "values", "get", "copy"};
const char* kListMethods[] = {"index", "count", "copy"};
const char* kMutators[] = {"append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse",
                           "update", "setdefault", "popitem"};

template <size_t N>
bool in_list(const char* (&names)[N], std::string_view name) {
  return std::any_of(std::begin(names), std::end(names), [&](const char* n) { return name == n; });
}

const std::string* opt_text(std::vector<Value>& args, size_t k) {
  if (k >= args.size() || args[k].kind == Kind::None) return nullptr;
  if (!args[k].is_string()) throw JinjaError(fmt::format("expected a string argument, not {}", type_name(args[k])));
  return &args[k].s;
}

int64_t opt_int(std::vector<Value>& args, Kwargs& kw, size_t k, std::string_view name, int64_t dflt) {
  const Value* v = k < args.size() ? &args[k] : nullptr;
  for (auto& [n, x] : kw)
    if (n == name) v = &x;
  if (!v || v->kind == Kind::None) return dflt;
  if (v->kind != Kind::Int) throw JinjaError(fmt::format("'{}' must be an integer", name));
  return v->i;
}

Value strings(std::vector<std::string> parts) {
  Array a;
  a.reserve(parts.size());
  for (auto& p : parts) a.push_back(Value::string(std::move(p)));
  return Value::array(std::move(a));
}

// startswith/endswith accept one prefix or a tuple (list) of them.
bool affix(const std::string& s, const Value& what, bool prefix) {
  auto one = [&](const Value& p) {
    if (!p.is_string()) throw JinjaError("startswith/endswith takes strings");
    return prefix ? s.compare(0, p.s.size(), p.s) == 0 && s.size() >= p.s.size()
                  : s.size() >= p.s.size() && s.compare(s.size() - p.s.size(), p.s.size(), p.s) == 0;
  };
  if (what.kind == Kind::Array) return std::any_of(what.arr->begin(), what.arr->end(), one);
  return one(what);
}

bool all_of_chars(const std::string& s, int (*pred)(int)) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [&](char c) { return pred((unsigned char)c) != 0; });
}

Value str_method(Interpreter& in, const std::string& s, const std::string& name, std::vector<Value>& a, Kwargs& kw) {
  auto need = [&](size_t n) {
    if (a.size() < n) throw JinjaError(fmt::format("str.{}() takes at least {} argument(s)", name, n));
  };
  if (name == "startswith" || name == "endswith") return need(1), Value::boolean(affix(s, a[0], name == "startswith"));
  if (name == "strip") return Value::string(py_strip(s, opt_text(a, 0)));
  if (name == "lstrip") return Value::string(py_strip(s, opt_text(a, 0), true, false));
  if (name == "rstrip") return Value::string(py_strip(s, opt_text(a, 0), false, true));
  if (name == "split" || name == "rsplit") {
    const Value* sep = a.size() > 0 ? &a[0] : nullptr;
    for (auto& [n, x] : kw)
      if (n == "sep") sep = &x;
    const std::string* sep_text = sep && sep->kind != Kind::None ? &sep->s : nullptr;
    if (sep && sep->kind != Kind::None && !sep->is_string()) throw JinjaError("the separator must be a string");
    const int64_t maxsplit = opt_int(a, kw, 1, "maxsplit", -1);
    return strings(name == "split" ? py_split(s, sep_text, maxsplit) : py_rsplit(s, sep_text, maxsplit));
  }
  if (name == "splitlines") return strings(py_splitlines(s, a.size() > 0 && truthy(a[0])));
  if (name == "replace") {
    need(2);
    if (!a[0].is_string() || !a[1].is_string()) throw JinjaError("str.replace() takes strings");
    std::string out = py_replace(s, a[0].s, a[1].s, opt_int(a, kw, 2, "count", -1));
    in.check_size(out.size());
    return Value::string(std::move(out));
  }
  if (name == "lower") return Value::string(py_lower(s));
  if (name == "upper") return Value::string(py_upper(s));
  if (name == "title") return Value::string(py_title(s));
  if (name == "capitalize") return Value::string(py_capitalize(s));
  if (name == "find" || name == "rfind" || name == "count") {
    need(1);
    if (!a[0].is_string()) throw JinjaError(fmt::format("str.{}() takes a string", name));
    const std::string& sub = a[0].s;
    // Byte offsets are turned into code point offsets, as Python counts them.
    auto cp_index = [&](size_t byte) { return (int64_t)code_points(std::string_view(s).substr(0, byte)).size(); };
    if (name == "count") {
      if (sub.empty()) return Value::integer((int64_t)code_points(s).size() + 1);
      int64_t n = 0;
      for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
      return Value::integer(n);
    }
    const size_t p = name == "find" ? s.find(sub) : s.rfind(sub);
    return Value::integer(p == std::string::npos ? -1 : cp_index(p));
  }
  if (name == "join") {
    need(1);
    std::string out;
    bool first = true;
    for (const Value& x : iterate(a[0])) {
      if (!x.is_string()) throw JinjaError(fmt::format("sequence item: expected str instance, {} found", type_name(x)));
      if (!first) out += s;
      first = false;
      out += x.s;
      in.check_size(out.size());
    }
    return Value::string(std::move(out));
  }
  if (name == "isdigit") return Value::boolean(all_of_chars(s, ::isdigit));
  if (name == "isalpha") return Value::boolean(all_of_chars(s, ::isalpha));
  if (name == "isalnum") return Value::boolean(all_of_chars(s, ::isalnum));
  if (name == "isspace") return Value::boolean(!s.empty() && py_strip(s, nullptr).empty());
  if (name == "islower") return Value::boolean(py_lower(s) == s && py_upper(s) != s);
  if (name == "isupper") return Value::boolean(py_upper(s) == s && py_lower(s) != s);
  if (name == "removeprefix" || name == "removesuffix") {
    need(1);
    const bool prefix = name == "removeprefix";
    return Value::string(affix(s, a[0], prefix) ? (prefix ? s.substr(a[0].s.size()) : s.substr(0, s.size() - a[0].s.size())) : s);
  }
  throw JinjaError(fmt::format("the method str.{}() is not supported", name), true);
}

}  // namespace

bool has_method(const Value& obj, std::string_view name) {
  switch (obj.kind) {
    case Kind::String: return in_list(kStrMethods, name);
    case Kind::Object: return in_list(kDictMethods, name) || in_list(kMutators, name);
    case Kind::Array: return in_list(kListMethods, name) || in_list(kMutators, name);
    default: return false;
  }
}

std::optional<Value> call_method(Interpreter& in, const Value& obj, const std::string& name, std::vector<Value>& a,
                                 Kwargs& kw) {
  if (!has_method(obj, name)) return std::nullopt;
  if (in_list(kMutators, name))
    throw JinjaError(fmt::format("{}.{}() modifies its object, which the sandbox refuses", type_name(obj), name));
  if (obj.kind == Kind::String) return str_method(in, obj.s, name, a, kw);
  if (obj.kind == Kind::Object) {
    const Object& o = *obj.obj;
    if (name == "items") {
      Array out;
      for (auto& [k, x] : o.items) out.push_back(Value::tuple({Value::string(k), x}));
      return Value::array(std::move(out));
    }
    if (name == "keys") return Value::array(iterate(obj));
    if (name == "values") {
      Array out;
      for (auto& kv : o.items) out.push_back(kv.second);
      return Value::array(std::move(out));
    }
    if (name == "copy") {
      Value c = Value::object();
      *c.obj = o;
      return c;
    }
    // get(key, default=None)
    if (a.empty()) throw JinjaError("dict.get() takes at least 1 argument");
    const Value* v = a[0].is_string() ? o.find(a[0].s) : nullptr;
    return v ? *v : a.size() > 1 ? a[1] : Value::none();
  }
  const Array& arr = *obj.arr;
  if (name == "copy") return Value::array(arr);
  if (a.empty()) throw JinjaError(fmt::format("list.{}() takes an argument", name));
  if (name == "count") return Value::integer(std::count_if(arr.begin(), arr.end(), [&](const Value& x) { return equal(x, a[0]); }));
  for (size_t k = 0; k < arr.size(); ++k)
    if (equal(arr[k], a[0])) return Value::integer((int64_t)k);
  throw JinjaError(fmt::format("{} is not in list", py_repr(a[0])));
}

}  // namespace rl::jinja
