// Python's str methods on UTF-8 text, as the chat templates call them (strip, split, replace,
// ...). Whitespace is Python's str.isspace() set; case changes cover ASCII letters only.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace rl::jinja {

// chars == nullptr: strip whitespace; otherwise strip any of the code points in *chars.
std::string py_strip(std::string_view s, const std::string* chars = nullptr, bool left = true, bool right = true);
// sep == nullptr: split on runs of whitespace, dropping empty parts. maxsplit < 0: no limit.
std::vector<std::string> py_split(std::string_view s, const std::string* sep, int64_t maxsplit);
std::vector<std::string> py_rsplit(std::string_view s, const std::string* sep, int64_t maxsplit);
std::vector<std::string> py_splitlines(std::string_view s, bool keepends);
std::string py_replace(std::string_view s, std::string_view old, std::string_view repl, int64_t count);
std::string py_lower(std::string_view s);
std::string py_upper(std::string_view s);
std::string py_capitalize(std::string_view s);
std::string py_title(std::string_view s);
// Jinja's indent filter: every line but the first (unless `first`) gets `pad`; empty lines only
// with `blank`.
std::string py_indent(std::string_view s, const std::string& pad, bool first, bool blank);

}  // namespace rl::jinja
