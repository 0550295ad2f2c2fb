#include "generate/python_text.h"

#include <cmath>

#include <fmt/format.h>

namespace rl {

using ojson = nlohmann::ordered_json;

std::string py_float_repr(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

namespace {

void json_string(std::string& out, std::string_view s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) out += fmt::format("\\u{:04x}", c);
        else out += (char)c;
    }
  }
  out += '"';
}

void json_dump(std::string& out, const ojson& v, int indent, int level) {
  // Python puts a newline and the next level's indent before each item when indenting.
  auto item_break = [&](int lvl) {
    if (indent < 0) return;
    out += '\n';
    out.append((size_t)indent * lvl, ' ');
  };
  const char* sep = indent < 0 ? ", " : ",";
  switch (v.type()) {
    case ojson::value_t::null: out += "null"; break;
    case ojson::value_t::boolean: out += v.get<bool>() ? "true" : "false"; break;
    case ojson::value_t::number_integer: out += std::to_string(v.get<int64_t>()); break;
    case ojson::value_t::number_unsigned: out += std::to_string(v.get<uint64_t>()); break;
    case ojson::value_t::number_float: out += py_float_repr(v.get<double>()); break;
    case ojson::value_t::string: json_string(out, v.get_ref<const std::string&>()); break;
    case ojson::value_t::array: {
      if (v.empty()) { out += "[]"; break; }
      out += '[';
      bool first = true;
      for (auto& e : v) {
        if (!first) out += sep;
        first = false;
        item_break(level + 1);
        json_dump(out, e, indent, level + 1);
      }
      item_break(level);
      out += ']';
      break;
    }
    case ojson::value_t::object: {
      if (v.empty()) { out += "{}"; break; }
      out += '{';
      bool first = true;
      for (auto& [k, e] : v.items()) {
        if (!first) out += sep;
        first = false;
        item_break(level + 1);
        json_string(out, k);
        out += ": ";
        json_dump(out, e, indent, level + 1);
      }
      item_break(level);
      out += '}';
      break;
    }
    default: out += "null";
  }
}

void repr_to(std::string& out, const ojson& v) {
  if (v.is_string()) {
    // Python repr picks single quotes unless the text holds one and no double quote.
    const std::string& s = v.get_ref<const std::string&>();
    const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
    const char q = dq ? '"' : '\'';
    out += q;
    for (char c : s) {
      if (c == '\\') out += "\\\\";
      else if (c == q) { out += '\\'; out += q; }
      else if (c == '\n') out += "\\n";
      else if (c == '\t') out += "\\t";
      else if (c == '\r') out += "\\r";
      else out += c;
    }
    out += q;
  } else if (v.is_array()) {
    out += '[';
    bool first = true;
    for (auto& e : v) {
      if (!first) out += ", ";
      first = false;
      repr_to(out, e);
    }
    out += ']';
  } else if (v.is_object()) {
    out += '{';
    bool first = true;
    for (auto& [k, e] : v.items()) {
      if (!first) out += ", ";
      first = false;
      repr_to(out, ojson(k));
      out += ": ";
      repr_to(out, e);
    }
    out += '}';
  } else {
    out += py_str(v);
  }
}

}  // namespace

std::string py_json_dumps(const ojson& value, int indent) {
  std::string out;
  json_dump(out, value, indent, 0);
  return out;
}

std::string py_str(const ojson& v) {
  switch (v.type()) {
    case ojson::value_t::null: return "None";
    case ojson::value_t::boolean: return v.get<bool>() ? "True" : "False";
    case ojson::value_t::number_integer: return std::to_string(v.get<int64_t>());
    case ojson::value_t::number_unsigned: return std::to_string(v.get<uint64_t>());
    case ojson::value_t::number_float: {
      std::string s = py_float_repr(v.get<double>());
      return s == "NaN" ? "nan" : s == "Infinity" ? "inf" : s == "-Infinity" ? "-inf" : s;
    }
    case ojson::value_t::string: return v.get<std::string>();
    default: {
      std::string out;
      repr_to(out, v);
      return out;
    }
  }
}

std::string py_repr(const ojson& v) {
  std::string out;
  repr_to(out, v);
  return out;
}

}  // namespace rl
