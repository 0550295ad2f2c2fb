#include "generate/jinja_strings.h"

#include <algorithm>

#include "common/utf8.h"
#include "generate/jinja_value.h"

namespace rl::jinja {

namespace {

bool is_py_space(std::string_view cp) {
  const uint32_t c = utf8_code_point(cp);
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

std::string join(const std::vector<std::string_view>& cps, size_t b, size_t e) {
  std::string out;
  for (size_t k = b; k < e; ++k) out += cps[k];
  return out;
}

}  // namespace

std::string py_strip(std::string_view s, const std::string* chars, bool left, bool right) {
  const auto cps = code_points(s);
  std::vector<std::string_view> set;
  if (chars) set = code_points(*chars);
  auto strip_it = [&](std::string_view cp) {
    return chars ? std::find(set.begin(), set.end(), cp) != set.end() : is_py_space(cp);
  };
  size_t b = 0, e = cps.size();
  if (left) while (b < e && strip_it(cps[b])) ++b;
  if (right) while (e > b && strip_it(cps[e - 1])) --e;
  return join(cps, b, e);
}

std::vector<std::string> py_split(std::string_view s, const std::string* sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) throw JinjaError("empty separator");
    size_t b = 0;
    for (;;) {
      const size_t p = (maxsplit < 0 || (int64_t)out.size() < maxsplit) ? s.find(*sep, b) : std::string_view::npos;
      if (p == std::string_view::npos) {
        out.emplace_back(s.substr(b));
        return out;
      }
      out.emplace_back(s.substr(b, p - b));
      b = p + sep->size();
    }
  }
  const auto cps = code_points(s);
  size_t k = 0;
  while (k < cps.size()) {
    while (k < cps.size() && is_py_space(cps[k])) ++k;
    if (k == cps.size()) break;
    if (maxsplit >= 0 && (int64_t)out.size() == maxsplit) {
      size_t e = cps.size();
      while (e > k && is_py_space(cps[e - 1])) --e;
      out.push_back(join(cps, k, e));
      break;
    }
    size_t e = k;
    while (e < cps.size() && !is_py_space(cps[e])) ++e;
    out.push_back(join(cps, k, e));
    k = e;
  }
  return out;
}

std::vector<std::string> py_rsplit(std::string_view s, const std::string* sep, int64_t maxsplit) {
  if (maxsplit < 0) return py_split(s, sep, maxsplit);
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) throw JinjaError("empty separator");
    size_t e = s.size();
    while ((int64_t)out.size() < maxsplit) {
      if (e < sep->size()) break;
      const size_t p = s.rfind(*sep, e - sep->size());
      if (p == std::string_view::npos) break;
      out.emplace_back(s.substr(p + sep->size(), e - p - sep->size()));
      e = p;
    }
    out.emplace_back(s.substr(0, e));
    std::reverse(out.begin(), out.end());
    return out;
  }
  const auto cps = code_points(s);
  size_t e = cps.size();
  while (e > 0) {
    while (e > 0 && is_py_space(cps[e - 1])) --e;
    if (e == 0) break;
    if ((int64_t)out.size() == maxsplit) {
      size_t b = 0;
      while (b < e && is_py_space(cps[b])) ++b;
      out.push_back(join(cps, b, e));
      break;
    }
    size_t b = e;
    while (b > 0 && !is_py_space(cps[b - 1])) --b;
    out.push_back(join(cps, b, e));
    e = b;
  }
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> py_splitlines(std::string_view s, bool keepends) {
  std::vector<std::string> out;
  size_t b = 0;
  for (size_t k = 0; k < s.size(); ++k) {
    const char c = s[k];
    if (c != '\n' && c != '\r' && c != '\v' && c != '\f' && c != '\x1c' && c != '\x1d' && c != '\x1e') continue;
    size_t end = k + 1;
    if (c == '\r' && k + 1 < s.size() && s[k + 1] == '\n') end = k + 2;
    out.emplace_back(s.substr(b, (keepends ? end : k) - b));
    b = end;
    k = end - 1;
  }
  if (b < s.size()) out.emplace_back(s.substr(b));
  return out;
}

std::string py_replace(std::string_view s, std::string_view old, std::string_view repl, int64_t count) {
  std::string out;
  if (old.empty()) {  // Python inserts the replacement between every character
    const auto cps = code_points(s);
    int64_t n = 0;
    for (size_t k = 0; k <= cps.size(); ++k) {
      if (count < 0 || n < count) {
        out += repl;
        ++n;
      }
      if (k < cps.size()) out += cps[k];
    }
    return out;
  }
  size_t b = 0;
  int64_t n = 0;
  for (;;) {
    const size_t p = (count < 0 || n < count) ? s.find(old, b) : std::string_view::npos;
    if (p == std::string_view::npos) break;
    out += s.substr(b, p - b);
    out += repl;
    b = p + old.size();
    ++n;
  }
  out += s.substr(b);
  return out;
}

std::string py_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = (char)(c - 'A' + 'a');
  return out;
}

std::string py_upper(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'a' && c <= 'z') c = (char)(c - 'a' + 'A');
  return out;
}

std::string py_capitalize(std::string_view s) {
  std::string out = py_lower(s);
  if (!out.empty() && out[0] >= 'a' && out[0] <= 'z') out[0] = (char)(out[0] - 'a' + 'A');
  return out;
}

std::string py_title(std::string_view s) {
  std::string out(s);
  bool prev_cased = false;
  for (char& c : out) {
    const bool lower = c >= 'a' && c <= 'z', upper = c >= 'A' && c <= 'Z';
    if (lower && !prev_cased) c = (char)(c - 'a' + 'A');
    else if (upper && prev_cased) c = (char)(c - 'A' + 'a');
    prev_cased = lower || upper;
  }
  return out;
}

std::string py_indent(std::string_view s, const std::string& pad, bool first, bool blank) {
  // As jinja2's do_indent: a newline is added before splitting, lines are joined with "\n", and
  // only empty lines (not whitespace-only ones) are left unindented unless `blank`.
  const std::vector<std::string> lines = py_splitlines(std::string(s) + "\n", false);
  std::string out = lines.empty() ? std::string() : lines[0];
  for (size_t k = 1; k < lines.size(); ++k) out += "\n" + ((blank || !lines[k].empty()) ? pad : std::string()) + lines[k];
  return first ? pad + out : out;
}

}  // namespace rl::jinja
