#include "generate/jinja_builtins.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>

#include <fmt/format.h>

#include "generate/jinja_interpreter.h"
#include "generate/jinja_strings.h"
#include "generate/python_text.h"

namespace rl::jinja {

namespace {

[[noreturn]] void type_error(std::string_view what) { throw JinjaError(std::string(what)); }

const Value* kwarg(Kwargs& kw, std::string_view name) {
  for (auto& [k, v] : kw)
    if (k == name) return &v;
  return nullptr;
}

// Positional argument `k`, else keyword `name`, else null.
const Value* arg(std::vector<Value>& args, Kwargs& kw, size_t k, std::string_view name) {
  if (k < args.size()) return &args[k];
  return kwarg(kw, name);
}

std::string text_arg(std::vector<Value>& args, Kwargs& kw, size_t k, std::string_view name, std::string dflt = {}) {
  const Value* v = arg(args, kw, k, name);
  if (!v || v->is_undefined()) return dflt;
  if (!v->is_string()) type_error(fmt::format("argument '{}' must be a string, not {}", name, type_name(*v)));
  return v->s;
}

int64_t int_arg(std::vector<Value>& args, Kwargs& kw, size_t k, std::string_view name, int64_t dflt) {
  const Value* v = arg(args, kw, k, name);
  if (!v || v->is_undefined() || v->kind == Kind::None) return dflt;
  if (v->kind != Kind::Int && v->kind != Kind::Bool) type_error(fmt::format("argument '{}' must be an integer", name));
  return v->kind == Kind::Bool ? v->b : v->i;
}

bool bool_arg(std::vector<Value>& args, Kwargs& kw, size_t k, std::string_view name, bool dflt) {
  const Value* v = arg(args, kw, k, name);
  return v && !v->is_undefined() ? truthy(*v) : dflt;
}

Value attribute_of(const Value& v, const std::string& path) {
  Value cur = v;
  size_t b = 0;
  while (b <= path.size()) {
    size_t e = path.find('.', b);
    std::string part = path.substr(b, e == std::string::npos ? std::string::npos : e - b);
    if (cur.kind == Kind::Object || cur.kind == Kind::Namespace) {
      const Value* x = cur.obj->find(part);
      cur = x ? *x : Value::undefined(part);
    } else if (cur.kind == Kind::Array && !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit)) {
      const size_t k = std::stoul(part);
      cur = k < cur.arr->size() ? (*cur.arr)[k] : Value::undefined(part);
    } else {
      return Value::undefined(part);
    }
    if (e == std::string::npos) break;
    b = e + 1;
  }
  return cur;
}

// Sorting key order for sort/dictsort/min/max: numbers and strings, as Python compares them.
bool less_than(const Value& a, const Value& b, bool case_sensitive) {
  if (a.is_number() && b.is_number()) return a.as_double() < b.as_double();
  if (a.is_string() && b.is_string()) return case_sensitive ? a.s < b.s : py_lower(a.s) < py_lower(b.s);
  type_error(fmt::format("'<' not supported between instances of '{}' and '{}'", type_name(a), type_name(b)));
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

Value to_int(const Value& v, int64_t dflt) {
  switch (v.kind) {
    case Kind::Int: return v;
    case Kind::Bool: return Value::integer(v.b);
    case Kind::Float: return std::isfinite(v.f) ? Value::integer((int64_t)v.f) : Value::integer(dflt);
    case Kind::String: {
      std::string s = py_strip(v.s, nullptr);
      char* end = nullptr;
      errno = 0;
      long long x = std::strtoll(s.c_str(), &end, 10);
      if (!s.empty() && *end == 0 && errno == 0) return Value::integer(x);
      double f = std::strtod(s.c_str(), &end);
      if (!s.empty() && *end == 0 && std::isfinite(f)) return Value::integer((int64_t)f);
      return Value::integer(dflt);
    }
    default: return Value::integer(dflt);
  }
}

using FilterFn = Value (*)(Interpreter&, const Value&, std::vector<Value>&, Kwargs&);

Value select_items(Interpreter& in, const Value& v, std::vector<Value>& args, bool by_attr, bool keep) {
  Array out;
  size_t k = 0;
  std::string attr;
  if (by_attr) {
    if (args.empty() || !args[0].is_string()) type_error("needs an attribute name");
    attr = args[k++].s;
  }
  std::string test = k < args.size() && args[k].is_string() ? args[k++].s : std::string();
  if (!test.empty() && !is_known_test(test))
    throw JinjaError(fmt::format("the test '{}' is not supported", test), true);
  std::vector<Value> test_args(args.begin() + (std::ptrdiff_t)std::min(k, args.size()), args.end());
  for (const Value& x : iterate(v)) {
    in.step();
    const Value subject = by_attr ? attribute_of(x, attr) : x;
    const bool pass = test.empty() ? truthy(subject) : apply_test(in, test, subject, test_args);
    if (pass == keep) out.push_back(x);
  }
  return Value::array(std::move(out));
}

struct FilterEntry {
  const char* name;
  FilterFn fn;
};

const FilterEntry kFilters[] = {
    {"tojson", [](Interpreter& in, const Value& v, std::vector<Value>& a, Kwargs& kw) {
       const Value* indent = arg(a, kw, 0, "indent");
       if (kwarg(kw, "separators") || kwarg(kw, "sort_keys") || kwarg(kw, "ensure_ascii"))
         throw JinjaError("tojson with separators, sort_keys or ensure_ascii is not supported", true);
       const int n = indent && indent->kind == Kind::Int ? (int)indent->i : -1;
       std::string s = py_json_dumps(to_json(v), n);
       in.check_size(s.size());
       return Value::string(std::move(s));
     }},
    {"trim", [](Interpreter&, const Value& v, std::vector<Value>& a, Kwargs& kw) {
       const Value* chars = arg(a, kw, 0, "chars");
       std::string set = chars && chars->is_string() ? chars->s : std::string();
       return Value::string(py_strip(py_str(v), chars && chars->is_string() ? &set : nullptr));
     }},
    {"length", [](Interpreter&, const Value& v, std::vector<Value>&, Kwargs&) { return Value::integer(length_of(v)); }},
    {"count", [](Interpreter&, const Value& v, std::vector<Value>&, Kwargs&) { return Value::integer(length_of(v)); }},
    {"items", [](Interpreter&, const Value& v, std::vector<Value>&, Kwargs&) {
       if (v.is_undefined()) return Value::array();
       if (v.kind != Kind::Object) type_error("Can only get item pairs from a mapping.");
       Array out;
       for (auto& [k, x] : v.obj->items) out.push_back(Value::tuple({Value::string(k), x}));
       return Value::array(std::move(out));
     }},
    {"string", [](Interpreter&, const Value& v, std::vector<Value>&, Kwargs&) { return Value::string(py_str(v)); }},
    {"safe", [](Interpreter&, const Value& v, std::vector<Value>&, Kwargs&) { return Value::string(py_str(v)); }},
    {"default", [](Interpreter&, const Value& v, std::vector<Value>& a, Kwargs& kw) {
       const bool boolean = bool_arg(a, kw, 1, "boolean", false);
       if (v.is_undefined() || (boolean && !truthy(v))) {
         const Value* d = arg(a, kw, 0, "default_value");
         return d ? *d : Value::string("");
       }
       return v;
     }},
    {"first", [](Interpreter&, const Value& v, std::vector<Value>&, Kwargs&) {
       Array items = iterate(v);
       return items.empty() ? Value::undefined("first") : items.front();
     }},
    {"last", [](Interpreter&, const Value& v, std::vector<Value>&, Kwargs&) {
       Array items = iterate(v);
       return items.empty() ? Value::undefined("last") : items.back();
     }},
    {"join", [](Interpreter& in, const Value& v, std::vector<Value>& a, Kwargs& kw) {
       const std::string sep = text_arg(a, kw, 0, "d");
       const Value* attr = arg(a, kw, 1, "attribute");
       std::string out;
       bool first = true;
       for (const Value& x : iterate(v)) {
         if (!first) out += sep;
         first = false;
         out += py_str(attr && attr->is_string() ? attribute_of(x, attr->s) : x);
         in.check_size(out.size());
       }
       return Value::string(std::move(out));
     }},
    {"lower", [](Interpreter&, const Value& v, std::vector<Value>&, Kwargs&) { return Value::string(py_lower(py_str(v))); }},
    {"upper", [](Interpreter&, const Value& v, std::vector<Value>&, Kwargs&) { return Value::string(py_upper(py_str(v))); }},
    {"capitalize", [](Interpreter&, const Value& v, std::vector<Value>&, Kwargs&) { return Value::string(py_capitalize(py_str(v))); }},
    {"title", [](Interpreter&, const Value& v, std::vector<Value>&, Kwargs&) { return Value::string(py_title(py_str(v))); }},
    {"replace", [](Interpreter& in, const Value& v, std::vector<Value>& a, Kwargs& kw) {
       std::string s = py_replace(py_str(v), text_arg(a, kw, 0, "old"), text_arg(a, kw, 1, "new"), int_arg(a, kw, 2, "count", -1));
       in.check_size(s.size());
       return Value::string(std::move(s));
     }},
    {"list", [](Interpreter&, const Value& v, std::vector<Value>&, Kwargs&) { return Value::array(iterate(v)); }},
    {"map", [](Interpreter& in, const Value& v, std::vector<Value>& a, Kwargs& kw) {
       Array out;
       if (const Value* attr = kwarg(kw, "attribute")) {
         const Value* dflt = kwarg(kw, "default");
         for (const Value& x : iterate(v)) {
           Value y = attribute_of(x, py_str(*attr));
           out.push_back(y.is_undefined() && dflt ? *dflt : y);
         }
         return Value::array(std::move(out));
       }
       if (a.empty() || !a[0].is_string()) type_error("map needs a filter name or attribute=");
       const std::string name = a[0].s;
       if (!is_known_filter(name)) throw JinjaError(fmt::format("the filter '{}' is not supported", name), true);
       std::vector<Value> rest(a.begin() + 1, a.end());
       for (const Value& x : iterate(v)) {
         std::vector<Value> fa = rest;
         Kwargs fk;
         out.push_back(apply_filter(in, name, x, fa, fk));
       }
       return Value::array(std::move(out));
     }},
    {"select", [](Interpreter& in, const Value& v, std::vector<Value>& a, Kwargs&) { return select_items(in, v, a, false, true); }},
    {"reject", [](Interpreter& in, const Value& v, std::vector<Value>& a, Kwargs&) { return select_items(in, v, a, false, false); }},
    {"selectattr", [](Interpreter& in, const Value& v, std::vector<Value>& a, Kwargs&) { return select_items(in, v, a, true, true); }},
    {"rejectattr", [](Interpreter& in, const Value& v, std::vector<Value>& a, Kwargs&) { return select_items(in, v, a, true, false); }},
    {"unique", [](Interpreter&, const Value& v, std::vector<Value>&, Kwargs&) {
       Array out;
       for (const Value& x : iterate(v))
         if (std::none_of(out.begin(), out.end(), [&](const Value& y) { return equal(x, y); })) out.push_back(x);
       return Value::array(std::move(out));
     }},
    {"reverse", [](Interpreter&, const Value& v, std::vector<Value>&, Kwargs&) {
       if (v.is_string()) {
         auto cps = code_points(v.s);
         std::string out;
         for (auto it = cps.rbegin(); it != cps.rend(); ++it) out += *it;
         return Value::string(std::move(out));
       }
       Array items = iterate(v);
       std::reverse(items.begin(), items.end());
       return Value::array(std::move(items));
     }},
    {"sort", [](Interpreter&, const Value& v, std::vector<Value>& a, Kwargs& kw) {
       const bool rev = bool_arg(a, kw, 0, "reverse", false);
       const bool cs = bool_arg(a, kw, 1, "case_sensitive", false);
       const Value* attr = arg(a, kw, 2, "attribute");
       Array items = iterate(v);
       auto key = [&](const Value& x) { return attr && attr->is_string() ? attribute_of(x, attr->s) : x; };
       std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
         return rev ? less_than(key(y), key(x), cs) : less_than(key(x), key(y), cs);
       });
       return Value::array(std::move(items));
     }},
    {"dictsort", [](Interpreter&, const Value& v, std::vector<Value>& a, Kwargs& kw) {
       if (v.kind != Kind::Object) type_error("You can only sort by either a mapping");
       const bool cs = bool_arg(a, kw, 0, "case_sensitive", false);
       const bool by_value = text_arg(a, kw, 1, "by", "key") == "value";
       const bool rev = bool_arg(a, kw, 2, "reverse", false);
       Array items;
       for (auto& [k, x] : v.obj->items) items.push_back(Value::tuple({Value::string(k), x}));
       std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
         const Value& kx = (*x.arr)[by_value], &ky = (*y.arr)[by_value];
         return rev ? less_than(ky, kx, cs) : less_than(kx, ky, cs);
       });
       return Value::array(std::move(items));
     }},
    {"int", [](Interpreter&, const Value& v, std::vector<Value>& a, Kwargs& kw) { return to_int(v, int_arg(a, kw, 0, "default", 0)); }},
    {"float", [](Interpreter&, const Value& v, std::vector<Value>&, Kwargs&) {
       if (v.is_number()) return Value::number(v.as_double());
       if (v.is_string()) {
         std::string s = py_strip(v.s, nullptr);
         char* end = nullptr;
         double f = std::strtod(s.c_str(), &end);
         if (!s.empty() && *end == 0) return Value::number(f);
       }
       return Value::number(0.0);
     }},
    {"abs", [](Interpreter&, const Value& v, std::vector<Value>&, Kwargs&) {
       if (v.kind == Kind::Int) return Value::integer(v.i < 0 ? -v.i : v.i);
       if (v.kind == Kind::Float) return Value::number(std::fabs(v.f));
       type_error(fmt::format("bad operand type for abs(): '{}'", type_name(v)));
     }},
    {"round", [](Interpreter&, const Value& v, std::vector<Value>& a, Kwargs& kw) {
       if (!v.is_number()) type_error("round needs a number");
       const int64_t digits = int_arg(a, kw, 0, "precision", 0);
       const std::string method = text_arg(a, kw, 1, "method", "common");
       const double scale = std::pow(10.0, (double)digits), x = v.as_double() * scale;
       const double r = method == "floor" ? std::floor(x) : method == "ceil" ? std::ceil(x) : std::round(x);
       return Value::number(r / scale);
     }},
    {"indent", [](Interpreter&, const Value& v, std::vector<Value>& a, Kwargs& kw) {
       const Value* w = arg(a, kw, 0, "width");
       const std::string pad = w && w->is_string() ? w->s : std::string((size_t)int_arg(a, kw, 0, "width", 4), ' ');
       return Value::string(py_indent(py_str(v), pad, bool_arg(a, kw, 1, "first", false), bool_arg(a, kw, 2, "blank", false)));
     }},
    {"escape", [](Interpreter&, const Value& v, std::vector<Value>&, Kwargs&) { return Value::string(html_escape(py_str(v))); }},
    {"e", [](Interpreter&, const Value& v, std::vector<Value>&, Kwargs&) { return Value::string(html_escape(py_str(v))); }},
    {"wordcount", [](Interpreter&, const Value& v, std::vector<Value>&, Kwargs&) {
       return Value::integer((int64_t)py_split(py_str(v), nullptr, -1).size());
     }},
    {"sum", [](Interpreter&, const Value& v, std::vector<Value>&, Kwargs&) {
       bool is_float = false;
       int64_t si = 0;
       double sf = 0;
       for (const Value& x : iterate(v)) {
         if (!x.is_number()) type_error("sum of non-numbers");
         is_float = is_float || x.kind == Kind::Float;
         si += x.kind == Kind::Bool ? x.b : x.i;
         sf += x.as_double();
       }
       return is_float ? Value::number(sf) : Value::integer(si);
     }},
    {"min", [](Interpreter&, const Value& v, std::vector<Value>&, Kwargs&) {
       Array items = iterate(v);
       if (items.empty()) return Value::undefined("min");
       return *std::min_element(items.begin(), items.end(), [](const Value& x, const Value& y) { return less_than(x, y, false); });
     }},
    {"max", [](Interpreter&, const Value& v, std::vector<Value>&, Kwargs&) {
       Array items = iterate(v);
       if (items.empty()) return Value::undefined("max");
       return *std::max_element(items.begin(), items.end(), [](const Value& x, const Value& y) { return less_than(x, y, false); });
     }},
};

const FilterEntry* find_filter(std::string_view name) {
  if (name == "d") name = "default";
  if (name == "count") name = "length";
  for (const FilterEntry& f : kFilters)
    if (name == f.name) return &f;
  return nullptr;
}

bool sequence_like(const Value& v) { return v.kind == Kind::String || v.kind == Kind::Array || v.kind == Kind::Object; }

}  // namespace

bool is_known_filter(std::string_view name) { return find_filter(name) != nullptr; }

Value apply_filter(Interpreter& in, const std::string& name, const Value& input, std::vector<Value>& args, Kwargs& kwargs) {
  const FilterEntry* f = find_filter(name);
  if (!f) throw JinjaError(fmt::format("the filter '{}' is not supported", name), true);
  return f->fn(in, input, args, kwargs);
}

namespace {
const char* kTests[] = {"defined", "undefined", "none", "string", "number", "integer", "float", "boolean",
                        "true", "false", "mapping", "iterable", "sequence", "callable", "even", "odd",
                        "divisibleby", "eq", "equalto", "ne", "lt", "le", "gt", "ge", "in", "sameas",
                        "lower", "upper", "filter", "test"};
}  // namespace

bool is_known_test(std::string_view name) {
  return std::any_of(std::begin(kTests), std::end(kTests), [&](const char* t) { return name == t; });
}

bool apply_test(Interpreter&, const std::string& name, const Value& v, std::vector<Value>& args) {
  auto need = [&](size_t n) {
    if (args.size() < n) type_error(fmt::format("the test '{}' needs an argument", name));
  };
  const bool integral = v.kind == Kind::Int;
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.kind == Kind::None;
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return integral;
  if (name == "float") return v.kind == Kind::Float;
  if (name == "boolean") return v.kind == Kind::Bool;
  if (name == "true") return v.kind == Kind::Bool && v.b;
  if (name == "false") return v.kind == Kind::Bool && !v.b;
  if (name == "mapping") return v.kind == Kind::Object;
  if (name == "iterable") return sequence_like(v) || v.is_undefined();
  if (name == "sequence") return sequence_like(v);
  if (name == "callable") return v.kind == Kind::Callable;
  if (name == "lower") return v.is_string() && py_lower(v.s) == v.s;
  if (name == "upper") return v.is_string() && py_upper(v.s) == v.s;
  if (name == "even" || name == "odd") {
    if (!integral) type_error("even/odd needs an integer");
    return ((v.i % 2) == 0) == (name == "even");
  }
  if (name == "divisibleby") {
    need(1);
    if (!integral || args[0].kind != Kind::Int || args[0].i == 0) type_error("divisibleby needs nonzero integers");
    return v.i % args[0].i == 0;
  }
  if (name == "eq" || name == "equalto") return need(1), equal(v, args[0]);
  if (name == "ne") return need(1), !equal(v, args[0]);
  if (name == "lt" || name == "le" || name == "gt" || name == "ge") {
    need(1);
    const bool lt = less_than(v, args[0], true), gt = less_than(args[0], v, true);
    return name == "lt" ? lt : name == "gt" ? gt : name == "le" ? !gt : !lt;
  }
  if (name == "in") {
    need(1);
    const Value& c = args[0];
    if (c.is_string()) return v.is_string() && c.s.find(v.s) != std::string::npos;
    if (c.kind == Kind::Object) return v.is_string() && c.obj->find(v.s);
    for (const Value& x : iterate(c))
      if (equal(v, x)) return true;
    return false;
  }
  if (name == "sameas") {
    need(1);
    const Value& o = args[0];
    if (v.kind != o.kind) return false;
    switch (v.kind) {
      case Kind::None:
      case Kind::Undefined: return true;
      case Kind::Bool: return v.b == o.b;
      case Kind::Int: return v.i == o.i;  // CPython caches small ints; templates only compare those
      case Kind::Array: return v.arr == o.arr;
      default: return v.obj == o.obj && v.fn == o.fn && v.s == o.s;
    }
  }
  if (name == "filter") return v.is_string() && is_known_filter(v.s);
  if (name == "test") return v.is_string() && is_known_test(v.s);
  throw JinjaError(fmt::format("the test '{}' is not supported", name), true);
}

Array iterate(const Value& v) {
  switch (v.kind) {
    case Kind::Array: return *v.arr;
    case Kind::Object: {
      Array keys;
      for (auto& [k, x] : v.obj->items) keys.push_back(Value::string(k));
      return keys;
    }
    case Kind::String: {
      Array chars;
      for (std::string_view c : code_points(v.s)) chars.push_back(Value::string(std::string(c)));
      return chars;
    }
    case Kind::Undefined: return {};
    default: type_error(fmt::format("'{}' object is not iterable", type_name(v)));
  }
}

int64_t length_of(const Value& v) {
  switch (v.kind) {
    case Kind::String: return (int64_t)code_points(v.s).size();
    case Kind::Array: return (int64_t)v.arr->size();
    case Kind::Object: return (int64_t)v.obj->items.size();
    case Kind::Undefined: return 0;
    default: type_error(fmt::format("object of type '{}' has no len()", type_name(v)));
  }
}

void add_global_functions(Object& g) {
  g.set("raise_exception", Value::callable("raise_exception", [](Interpreter&, std::vector<Value>& a, Kwargs&) -> Value {
          throw JinjaError(fmt::format("chat template raised an error: {}", a.empty() ? std::string() : py_str(a[0])));
        }));
  g.set("namespace", Value::callable("namespace", [](Interpreter&, std::vector<Value>& a, Kwargs& kw) {
          Value ns = Value::namespace_object();
          if (!a.empty() && a[0].kind == Kind::Object)
            for (auto& [k, x] : a[0].obj->items) ns.obj->set(k, x);
          for (auto& [k, x] : kw) ns.obj->set(k, x);
          return ns;
        }));
  g.set("dict", Value::callable("dict", [](Interpreter&, std::vector<Value>& a, Kwargs& kw) {
          Value d = Value::object();
          if (!a.empty() && a[0].kind == Kind::Object) *d.obj = *a[0].obj;
          for (auto& [k, x] : kw) d.obj->set(k, x);
          return d;
        }));
  g.set("range", Value::callable("range", [](Interpreter& in, std::vector<Value>& a, Kwargs& kw) {
          int64_t start = 0, stop = 0, step = 1;
          if (a.size() == 1) stop = int_arg(a, kw, 0, "stop", 0);
          else {
            start = int_arg(a, kw, 0, "start", 0);
            stop = int_arg(a, kw, 1, "stop", 0);
            step = int_arg(a, kw, 2, "step", 1);
          }
          if (step == 0) type_error("range() arg 3 must not be zero");
          Array out;
          for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
            in.step();
            out.push_back(Value::integer(k));
            in.check_size(out.size() * sizeof(Value));
          }
          return Value::array(std::move(out));
        }));
  g.set("strftime_now", Value::callable("strftime_now", [](Interpreter&, std::vector<Value>& a, Kwargs& kw) {
          const std::string f = text_arg(a, kw, 0, "format", "%Y-%m-%d");
          const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
          std::tm tm{};
          localtime_r(&now, &tm);
          char buf[256];
          const size_t n = std::strftime(buf, sizeof buf, f.c_str(), &tm);
          return Value::string(std::string(buf, n));
        }));
}

}  // namespace rl::jinja
