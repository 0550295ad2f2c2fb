// Python's text forms of JSON data: what the Hugging Face chat templates print, since they run
// on Python's jinja2 (str() of a value, repr() inside lists, json.dumps for `tojson`).
#pragma once
#include <string>

#include <nlohmann/json.hpp>

namespace rl {

// float.__repr__: the shortest text that reads back, always with a '.' or an exponent.
std::string py_float_repr(double v);
// json.dumps(value, ensure_ascii=False): keys in stored order, non-ASCII kept as UTF-8; with
// indent < 0 the separators are ", " and ": ", otherwise each item on its own line indented by
// `indent` spaces per level with "," and ": " (Python's defaults for both cases).
std::string py_json_dumps(const nlohmann::ordered_json& value, int indent = -1);
// str(value): True/False/None, float repr, strings as they are, lists and dicts in repr form.
std::string py_str(const nlohmann::ordered_json& value);
// repr(value): strings quoted as Python quotes them.
std::string py_repr(const nlohmann::ordered_json& value);

}  // namespace rl
