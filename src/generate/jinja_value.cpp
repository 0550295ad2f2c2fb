#include "generate/jinja_value.h"

#include "common/utf8.h"
#include "generate/python_text.h"

namespace rl::jinja {

using ojson = nlohmann::ordered_json;

Value Value::array(Array a) {
  Value v;
  v.kind = Kind::Array;
  v.arr = std::make_shared<Array>(std::move(a));
  return v;
}

Value Value::object() {
  Value v;
  v.kind = Kind::Object;
  v.obj = std::make_shared<Object>();
  return v;
}

Value Value::namespace_object() {
  Value v = object();
  v.kind = Kind::Namespace;
  return v;
}

Value Value::callable(std::string name, NativeFn fn) {
  Value v;
  v.kind = Kind::Callable;
  v.fn = std::make_shared<Callable>(Callable{std::move(name), std::move(fn)});
  return v;
}

const Value* Object::find(std::string_view key) const {
  for (auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void Object::set(const std::string& key, Value v) {
  for (auto& [k, old] : items)
    if (k == key) {
      old = std::move(v);
      return;
    }
  items.emplace_back(key, std::move(v));
}

Value from_json(const ojson& j) {
  switch (j.type()) {
    case ojson::value_t::null: return Value::none();
    case ojson::value_t::boolean: return Value::boolean(j.get<bool>());
    case ojson::value_t::number_integer: return Value::integer(j.get<int64_t>());
    case ojson::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      return u > (uint64_t)INT64_MAX ? Value::number((double)u) : Value::integer((int64_t)u);
    }
    case ojson::value_t::number_float: return Value::number(j.get<double>());
    case ojson::value_t::string: return Value::string(j.get<std::string>());
    case ojson::value_t::array: {
      Array a;
      a.reserve(j.size());
      for (auto& e : j) a.push_back(from_json(e));
      return Value::array(std::move(a));
    }
    case ojson::value_t::object: {
      Value v = Value::object();
      v.obj->items.reserve(j.size());
      for (auto& [k, e] : j.items()) v.obj->items.emplace_back(k, from_json(e));
      return v;
    }
    default: return Value::none();
  }
}

ojson to_json(const Value& v) {
  switch (v.kind) {
    case Kind::None: return nullptr;
    case Kind::Bool: return v.b;
    case Kind::Int: return v.i;
    case Kind::Float: return v.f;
    case Kind::String: return v.s;
    case Kind::Array: {
      ojson a = ojson::array();
      for (auto& e : *v.arr) a.push_back(to_json(e));
      return a;
    }
    case Kind::Object: {
      ojson o = ojson::object();
      for (auto& [k, e] : v.obj->items) o[k] = to_json(e);
      return o;
    }
    default: throw JinjaError(fmt::format("Object of type {} is not JSON serializable", type_name(v)));
  }
}

const char* type_name(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "NoneType";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "str";
    case Kind::Array: return "list";
    case Kind::Object: return "dict";
    case Kind::Namespace: return "Namespace";
    case Kind::Callable: return "function";
  }
  return "?";
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool: return v.b;
    case Kind::Int: return v.i != 0;
    case Kind::Float: return v.f != 0;
    case Kind::String: return !v.s.empty();
    case Kind::Array: return !v.arr->empty();
    case Kind::Object: return !v.obj->items.empty();
    default: return true;
  }
}

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind != Kind::Float && b.kind != Kind::Float)
      return (a.kind == Kind::Bool ? (int64_t)a.b : a.i) == (b.kind == Kind::Bool ? (int64_t)b.b : b.i);
    return a.as_double() == b.as_double();
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::Undefined:
    case Kind::None: return true;
    case Kind::String: return a.s == b.s;
    case Kind::Array: {
      if (a.arr->size() != b.arr->size()) return false;
      for (size_t k = 0; k < a.arr->size(); ++k)
        if (!equal((*a.arr)[k], (*b.arr)[k])) return false;
      return true;
    }
    case Kind::Object: {
      if (a.obj->items.size() != b.obj->items.size()) return false;
      for (auto& [k, e] : a.obj->items) {
        const Value* o = b.obj->find(k);
        if (!o || !equal(e, *o)) return false;
      }
      return true;
    }
    default: return a.obj == b.obj && a.fn == b.fn;
  }
}

namespace {

// Python prints a namespace or a macro as an object; templates do not print them, so the type
// name is enough.
std::string opaque(const Value& v) { return fmt::format("<{} object>", type_name(v)); }

void repr_to(std::string& out, const Value& v) {
  switch (v.kind) {
    case Kind::String: out += rl::py_repr(ojson(v.s)); break;
    case Kind::Array: {
      out += v.is_tuple ? '(' : '[';
      for (size_t k = 0; k < v.arr->size(); ++k) {
        if (k) out += ", ";
        repr_to(out, (*v.arr)[k]);
      }
      if (v.is_tuple && v.arr->size() == 1) out += ',';
      out += v.is_tuple ? ')' : ']';
      break;
    }
    case Kind::Object: {
      out += '{';
      bool first = true;
      for (auto& [k, x] : v.obj->items) {
        if (!first) out += ", ";
        first = false;
        out += rl::py_repr(ojson(k));
        out += ": ";
        repr_to(out, x);
      }
      out += '}';
      break;
    }
    case Kind::Undefined:
    case Kind::Namespace:
    case Kind::Callable: out += opaque(v); break;
    default: out += py_str(v);
  }
}

}  // namespace

std::string py_str(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined: return "";
    case Kind::String: return v.s;
    case Kind::None: return "None";
    case Kind::Bool: return v.b ? "True" : "False";
    case Kind::Int: return std::to_string(v.i);
    case Kind::Float: return rl::py_str(ojson(v.f));
    default: return py_repr(v);
  }
}

std::string py_repr(const Value& v) {
  std::string out;
  repr_to(out, v);
  return out;
}

std::vector<std::string_view> code_points(std::string_view s) {
  std::vector<std::string_view> out;
  out.reserve(s.size());
  for (size_t k = 0; k < s.size();) {
    size_t n = (size_t)utf8_sequence_length((uint8_t)s[k]);
    if (k + n > s.size()) n = s.size() - k;
    out.push_back(s.substr(k, n));
    k += n;
  }
  return out;
}

}  // namespace rl::jinja
