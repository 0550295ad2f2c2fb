// The filters, tests, global functions and str/dict/list methods chat templates call, each with
// Python's (jinja2's) behaviour; `tojson` is the Hugging Face one (json.dumps, ensure_ascii off,
// key order kept, optional indent).
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "generate/jinja_value.h"

namespace rl::jinja {

bool is_known_filter(std::string_view name);
bool is_known_test(std::string_view name);

Value apply_filter(Interpreter& in, const std::string& name, const Value& input, std::vector<Value>& args,
                   Kwargs& kwargs);
bool apply_test(Interpreter& in, const std::string& name, const Value& v, std::vector<Value>& args);

// obj.name(args) for a builtin method; nullopt when `obj` has no method of that name.
std::optional<Value> call_method(Interpreter& in, const Value& obj, const std::string& name,
                                 std::vector<Value>& args, Kwargs& kwargs);
bool has_method(const Value& obj, std::string_view name);

// range, namespace, dict, raise_exception, strftime_now: added to every render's globals.
void add_global_functions(Object& globals);

// Iterating a value as a for loop does (dict keys, a string's characters; undefined is empty).
Array iterate(const Value& v);
// Python's len().
int64_t length_of(const Value& v);

}  // namespace rl::jinja
