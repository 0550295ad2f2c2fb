#include "generate/jinja_interpreter.h"

#include <cmath>

#include <fmt/format.h>

#include "generate/jinja_builtins.h"

namespace rl::jinja {

void runtime_error(int line, std::string_view what) {
  throw JinjaError(fmt::format("chat template error at line {}: {}", line, what));
}

Value* Interpreter::Frame::find(std::string_view name) {
  for (Frame* f = this; f; f = f->parent)
    for (auto& [k, v] : f->vars)
      if (k == name) return &v;
  return nullptr;
}

void Interpreter::Frame::set(const std::string& name, Value v) {
  for (auto& [k, old] : vars)
    if (k == name) {
      old = std::move(v);
      return;
    }
  vars.emplace_back(name, std::move(v));
}

Interpreter::Interpreter(const Body& program, const RenderLimits& limits) : program_(program), limits_(limits) {}

std::string Interpreter::render(const Value& globals) {
  deadline_ = std::chrono::steady_clock::now() + limits_.time_budget;
  Frame root;
  for (auto& [k, v] : globals.obj->items) root.vars.emplace_back(k, v);
  root_ = &root;
  std::string out;
  exec(program_, root, out);
  root_ = nullptr;
  return out;
}

Interpreter::EvalDepth::EvalDepth(Interpreter& in) : in_(in) {
  if (++in_.eval_depth_ > kMaxEvalDepth) {
    --in_.eval_depth_;
    throw JinjaError(fmt::format("chat template: evaluation nested deeper than {} levels", kMaxEvalDepth));
  }
}

void Interpreter::step() {
  if ((++steps_ & 255) == 0 && std::chrono::steady_clock::now() > deadline_)
    throw JinjaError(fmt::format("chat template: rendering took longer than {} ms", limits_.time_budget.count()));
}

void Interpreter::check_size(size_t bytes) const {
  if (bytes > limits_.max_output_bytes)
    throw JinjaError(fmt::format("chat template: output larger than {} bytes", limits_.max_output_bytes));
}

Interpreter::Flow Interpreter::exec(const Body& body, Frame& frame, std::string& out) {
  EvalDepth depth(*this);
  for (const Stmt& s : body) {
    step();
    switch (s.type) {
      case Stmt::Type::Text: out += s.text; break;
      case Stmt::Type::Output: out += py_str(eval(*s.expr, frame)); break;
      case Stmt::Type::If:
        for (size_t k = 0; k < s.branches.size(); ++k) {
          if (s.conditions[k] && !truthy(eval(*s.conditions[k], frame))) continue;
          if (Flow f = exec(s.branches[k], frame, out); f != Flow::Normal) return f;
          break;
        }
        break;
      case Stmt::Type::For:
        if (Flow f = exec_for(s, frame, out); f != Flow::Normal) return f;
        break;
      case Stmt::Type::Set: exec_set(s, frame); break;
      case Stmt::Type::SetBlock: {
        std::string captured;
        exec(s.body, frame, captured);
        frame.set(s.text, Value::string(std::move(captured)));
        break;
      }
      case Stmt::Type::Macro: {
        const Stmt* macro = &s;
        frame.set(s.text, Value::callable(s.text, [macro](Interpreter& in, std::vector<Value>& args, Kwargs& kw) {
                    return in.call_macro(*macro, args, kw);
                  }));
        break;
      }
      case Stmt::Type::Break: return Flow::Break;
      case Stmt::Type::Continue: return Flow::Continue;
      case Stmt::Type::FilterBlock: {
        std::string captured;
        exec(s.body, frame, captured);
        Frame inner;
        inner.parent = &frame;
        inner.vars.emplace_back("", Value::string(std::move(captured)));
        out += py_str(eval(*s.expr, inner));
        break;
      }
      case Stmt::Type::Transparent:
        if (Flow f = exec(s.body, frame, out); f != Flow::Normal) return f;
        break;
    }
    check_size(out.size());
  }
  return Flow::Normal;
}

namespace {

void bind_targets(const std::vector<std::string>& targets, const Value& item, std::vector<std::pair<std::string, Value>>& vars,
                  int line) {
  auto put = [&](const std::string& k, Value v) {
    for (auto& [name, old] : vars)
      if (name == k) {
        old = std::move(v);
        return;
      }
    vars.emplace_back(k, std::move(v));
  };
  if (targets.size() == 1) {
    put(targets[0], item);
    return;
  }
  Array parts = iterate(item);
  if (parts.size() != targets.size())
    runtime_error(line, fmt::format("cannot unpack {} values into {} names", parts.size(), targets.size()));
  for (size_t k = 0; k < targets.size(); ++k) put(targets[k], parts[k]);
}

}  // namespace

Interpreter::Flow Interpreter::exec_for(const Stmt& s, Frame& frame, std::string& out) {
  const Value seq = eval(*s.expr, frame);
  if (seq.kind == Kind::None || seq.is_number() || seq.kind == Kind::Callable)
    runtime_error(s.line, fmt::format("'{}' object is not iterable", type_name(seq)));
  Array items = iterate(seq);
  Frame body_frame;
  body_frame.parent = &frame;
  if (s.cond) {  // `for x in xs if c`: the loop counts only the items that pass
    Array kept;
    for (Value& item : items) {
      step();
      bind_targets(s.targets, item, body_frame.vars, s.line);
      if (truthy(eval(*s.cond, body_frame))) kept.push_back(std::move(item));
    }
    items = std::move(kept);
    body_frame.vars.clear();
  }
  if (items.empty()) {
    exec(s.else_body, frame, out);
    return Flow::Normal;
  }

  const int64_t n = (int64_t)items.size();
  for (int64_t k = 0; k < n; ++k) {
    Value loop = Value::object();
    Object& o = *loop.obj;
    o.items.reserve(11);
    o.items.emplace_back("index", Value::integer(k + 1));
    o.items.emplace_back("index0", Value::integer(k));
    o.items.emplace_back("revindex", Value::integer(n - k));
    o.items.emplace_back("revindex0", Value::integer(n - k - 1));
    o.items.emplace_back("first", Value::boolean(k == 0));
    o.items.emplace_back("last", Value::boolean(k == n - 1));
    o.items.emplace_back("length", Value::integer(n));
    o.items.emplace_back("depth", Value::integer(1));
    o.items.emplace_back("depth0", Value::integer(0));
    if (k > 0) o.items.emplace_back("previtem", items[k - 1]);
    if (k + 1 < n) o.items.emplace_back("nextitem", items[k + 1]);
    o.items.emplace_back("cycle", Value::callable("cycle", [k](Interpreter&, std::vector<Value>& args, Kwargs&) {
                           if (args.empty()) throw JinjaError("loop.cycle() needs at least one value");
                           return args[(size_t)k % args.size()];
                         }));
    // Each iteration starts from the enclosing scope: jinja2 does not carry a `set` made in one
    // iteration into the next.
    body_frame.vars.clear();
    body_frame.set("loop", std::move(loop));
    bind_targets(s.targets, items[k], body_frame.vars, s.line);
    if (exec(s.body, body_frame, out) == Flow::Break) break;
  }
  return Flow::Normal;
}

void Interpreter::exec_set(const Stmt& s, Frame& frame) {
  Value v = eval(*s.expr, frame);
  if (s.attr_target) {
    Value* ns = frame.find(s.targets[0]);
    if (!ns || ns->kind != Kind::Namespace)
      runtime_error(s.line, fmt::format("cannot assign attribute on non-namespace object '{}'", s.targets[0]));
    ns->obj->set(s.targets[1], std::move(v));
    return;
  }
  bind_targets(s.targets, v, frame.vars, s.line);
}

Value Interpreter::call_macro(const Stmt& macro, std::vector<Value>& args, Kwargs& kwargs) {
  if (call_depth_ >= limits_.max_call_depth)
    throw JinjaError(fmt::format("chat template: macro calls nested deeper than {}", limits_.max_call_depth));
  if (args.size() > macro.params.size())
    runtime_error(macro.line, fmt::format("macro '{}' takes not more than {} argument(s)", macro.text, macro.params.size()));
  Frame f;
  f.parent = root_;
  for (size_t k = 0; k < macro.params.size(); ++k) {
    const std::string& p = macro.params[k];
    const Value* given = k < args.size() ? &args[k] : nullptr;
    for (auto& [name, v] : kwargs)
      if (name == p) given = &v;
    if (given) f.vars.emplace_back(p, *given);
    else if (macro.defaults[k]) f.vars.emplace_back(p, eval(*macro.defaults[k], f));
    else f.vars.emplace_back(p, Value::undefined(p));
  }
  for (auto& [name, v] : kwargs) {
    bool known = false;
    for (auto& p : macro.params) known = known || p == name;
    if (!known) runtime_error(macro.line, fmt::format("macro '{}' takes no keyword argument '{}'", macro.text, name));
  }
  ++call_depth_;
  std::string out;
  try {
    exec(macro.body, f, out);
  } catch (...) {
    --call_depth_;
    throw;
  }
  --call_depth_;
  return Value::string(std::move(out));
}

Value Interpreter::call(const Value& callee, std::vector<Value>& args, Kwargs& kwargs) {
  if (callee.kind != Kind::Callable) {
    if (callee.is_undefined()) throw JinjaError(fmt::format("chat template: '{}' is undefined", callee.s));
    throw JinjaError(fmt::format("chat template: '{}' object is not callable", type_name(callee)));
  }
  return callee.fn->fn(*this, args, kwargs);
}

void Interpreter::eval_args(const Expr& e, size_t first, Frame& frame, std::vector<Value>& args, Kwargs& kwargs) {
  const size_t n_kw = e.kwnames.size();
  const size_t n_pos = e.args.size() - first - n_kw;
  for (size_t k = 0; k < n_pos; ++k) args.push_back(eval(*e.args[first + k], frame));
  for (size_t k = 0; k < n_kw; ++k) kwargs.emplace_back(e.kwnames[k], eval(*e.args[first + n_pos + k], frame));
}

namespace {

Value get_item(const Value& obj, const Value& key) {
  switch (obj.kind) {
    case Kind::Array:
      if (key.kind == Kind::Int) {
        int64_t k = key.i < 0 ? key.i + (int64_t)obj.arr->size() : key.i;
        if (k >= 0 && k < (int64_t)obj.arr->size()) return (*obj.arr)[(size_t)k];
      }
      return Value::undefined("item");
    case Kind::Object:
    case Kind::Namespace:
      if (key.is_string())
        if (const Value* v = obj.obj->find(key.s)) return *v;
      return Value::undefined(key.is_string() ? key.s : py_str(key));
    case Kind::String:
      if (key.kind == Kind::Int) {
        auto cps = code_points(obj.s);
        int64_t k = key.i < 0 ? key.i + (int64_t)cps.size() : key.i;
        if (k >= 0 && k < (int64_t)cps.size()) return Value::string(std::string(cps[(size_t)k]));
      }
      return Value::undefined("item");
    default: return Value::undefined(key.is_string() ? key.s : py_str(key));
  }
}

// Python slice bounds for a sequence of length n.
std::vector<int64_t> slice_indices(int64_t n, const Value* start, const Value* stop, const Value* stepv, int line) {
  int64_t step = 1;
  if (stepv && stepv->kind == Kind::Int) step = stepv->i;
  if (step == 0) runtime_error(line, "slice step cannot be zero");
  auto bound = [&](const Value* v, int64_t dflt) {
    if (!v || v->kind == Kind::None || v->is_undefined()) return dflt;
    if (v->kind != Kind::Int) runtime_error(line, "slice indices must be integers");
    int64_t x = v->i;
    if (x < 0) x += n;
    if (step > 0) return std::clamp<int64_t>(x, 0, n);
    return std::clamp<int64_t>(x, -1, n - 1);
  };
  const int64_t b = bound(start, step > 0 ? 0 : n - 1);
  const int64_t e = bound(stop, step > 0 ? n : -1);
  std::vector<int64_t> idx;
  for (int64_t k = b; step > 0 ? k < e : k > e; k += step) idx.push_back(k);
  return idx;
}

}  // namespace

Value Interpreter::eval(const Expr& e, Frame& frame) {
  EvalDepth depth(*this);
  step();
  switch (e.type) {
    case Expr::Type::Literal: return e.literal;
    case Expr::Type::Name: {
      if (Value* v = frame.find(e.name)) return *v;
      return Value::undefined(e.name);
    }
    case Expr::Type::Attr: {
      Value obj = eval(*e.args[0], frame);
      if (obj.is_undefined())
        runtime_error(e.line, fmt::format("'{}' is undefined (reading its attribute '{}')", obj.s, e.name));
      if (has_method(obj, e.name)) {
        const std::string name = e.name;
        return Value::callable(name, [obj, name](Interpreter& in, std::vector<Value>& args, Kwargs& kw) {
          return *call_method(in, obj, name, args, kw);
        });
      }
      if (obj.kind == Kind::Object || obj.kind == Kind::Namespace) {
        if (const Value* v = obj.obj->find(e.name)) return *v;
      }
      return Value::undefined(e.name);
    }
    case Expr::Type::Item: {
      Value obj = eval(*e.args[0], frame);
      if (obj.is_undefined()) runtime_error(e.line, fmt::format("'{}' is undefined (reading an item of it)", obj.s));
      return get_item(obj, eval(*e.args[1], frame));
    }
    case Expr::Type::Slice: {
      Value obj = eval(*e.args[0], frame);
      Value parts[3];
      const Value* p[3] = {nullptr, nullptr, nullptr};
      for (int k = 0; k < 3; ++k)
        if (e.args[1 + k]) {
          parts[k] = eval(*e.args[1 + k], frame);
          p[k] = &parts[k];
        }
      if (obj.kind == Kind::Array) {
        Array out;
        for (int64_t k : slice_indices((int64_t)obj.arr->size(), p[0], p[1], p[2], e.line)) out.push_back((*obj.arr)[(size_t)k]);
        return Value::array(std::move(out));
      }
      if (obj.kind == Kind::String) {
        auto cps = code_points(obj.s);
        std::string out;
        for (int64_t k : slice_indices((int64_t)cps.size(), p[0], p[1], p[2], e.line)) out += cps[(size_t)k];
        return Value::string(std::move(out));
      }
      runtime_error(e.line, fmt::format("'{}' object is not subscriptable", type_name(obj)));
    }
    case Expr::Type::Call: return eval_call(e, frame);
    case Expr::Type::Filter: {
      Value input = eval(*e.args[0], frame);
      std::vector<Value> args;
      Kwargs kwargs;
      eval_args(e, 1, frame, args, kwargs);
      try {
        return apply_filter(*this, e.name, input, args, kwargs);
      } catch (const JinjaError& err) {
        if (err.unsupported) throw;
        runtime_error(e.line, fmt::format("filter '{}': {}", e.name, err.what()));
      }
    }
    case Expr::Type::Test: {
      Value v = eval(*e.args[0], frame);
      std::vector<Value> args;
      Kwargs kwargs;
      eval_args(e, 1, frame, args, kwargs);
      return Value::boolean(apply_test(*this, e.name, v, args) != e.negated);
    }
    case Expr::Type::Unary: {
      Value v = eval(*e.args[0], frame);
      if (v.kind == Kind::Int || v.kind == Kind::Bool) {
        const int64_t x = v.kind == Kind::Bool ? v.b : v.i;
        return Value::integer(e.name == "-" ? -x : x);
      }
      if (v.kind == Kind::Float) return Value::number(e.name == "-" ? -v.f : v.f);
      runtime_error(e.line, fmt::format("bad operand type for unary {}: '{}'", e.name, type_name(v)));
    }
    case Expr::Type::Binary: {
      Value a = eval(*e.args[0], frame);
      Value b = eval(*e.args[1], frame);
      return eval_binary(e, a, b);
    }
    case Expr::Type::And: {
      Value a = eval(*e.args[0], frame);
      return truthy(a) ? eval(*e.args[1], frame) : a;
    }
    case Expr::Type::Or: {
      Value a = eval(*e.args[0], frame);
      return truthy(a) ? a : eval(*e.args[1], frame);
    }
    case Expr::Type::Not: return Value::boolean(!truthy(eval(*e.args[0], frame)));
    case Expr::Type::Compare: {
      Value left = eval(*e.args[0], frame);
      for (size_t k = 0; k < e.ops.size(); ++k) {
        Value right = eval(*e.args[k + 1], frame);
        if (!compare(e.ops[k], left, right, e.line)) return Value::boolean(false);
        left = std::move(right);
      }
      return Value::boolean(true);
    }
    case Expr::Type::Cond: {
      if (truthy(eval(*e.args[0], frame))) return eval(*e.args[1], frame);
      return e.args[2] ? eval(*e.args[2], frame) : Value::undefined("else");
    }
    case Expr::Type::List:
    case Expr::Type::Tuple: {
      Array a;
      a.reserve(e.args.size());
      for (auto& x : e.args) a.push_back(eval(*x, frame));
      return e.type == Expr::Type::Tuple ? Value::tuple(std::move(a)) : Value::array(std::move(a));
    }
    case Expr::Type::Dict: {
      Value d = Value::object();
      for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
        Value key = eval(*e.args[k], frame);
        if (!key.is_string()) runtime_error(e.line, "dict keys must be strings here");
        d.obj->set(key.s, eval(*e.args[k + 1], frame));
      }
      return d;
    }
  }
  runtime_error(e.line, "unknown expression");
}

Value Interpreter::eval_call(const Expr& e, Frame& frame) {
  std::vector<Value> args;
  Kwargs kwargs;
  const Expr& callee = *e.args[0];
  if (callee.type == Expr::Type::Attr) {  // a method call: no bound-method object needed
    Value obj = eval(*callee.args[0], frame);
    if (obj.is_undefined())
      runtime_error(e.line, fmt::format("'{}' is undefined (calling its method '{}')", obj.s, callee.name));
    if (has_method(obj, callee.name)) {
      eval_args(e, 1, frame, args, kwargs);
      try {
        return *call_method(*this, obj, callee.name, args, kwargs);
      } catch (const JinjaError& err) {
        if (err.unsupported) throw;
        runtime_error(e.line, fmt::format("{}.{}(): {}", type_name(obj), callee.name, err.what()));
      }
    }
    if (obj.kind == Kind::String || obj.kind == Kind::Array || obj.kind == Kind::Object) {
      const Value* member = obj.kind == Kind::Object ? obj.obj->find(callee.name) : nullptr;
      if (!member)
        throw JinjaError(fmt::format("chat template line {}: the method {}.{}() is not supported", e.line,
                                     type_name(obj), callee.name), true);
    }
  }
  Value fn = eval(callee, frame);
  eval_args(e, 1, frame, args, kwargs);
  if (fn.is_undefined()) runtime_error(e.line, fmt::format("'{}' is undefined", fn.s));
  try {
    return call(fn, args, kwargs);
  } catch (const JinjaError& err) {
    if (err.unsupported || std::string_view(err.what()).rfind("chat template", 0) == 0) throw;
    runtime_error(e.line, err.what());
  }
}

Value Interpreter::eval_binary(const Expr& e, const Value& a, const Value& b) {
  const std::string& op = e.name;
  if (op == "~") {
    std::string s = py_str(a) + py_str(b);
    check_size(s.size());
    return Value::string(std::move(s));
  }
  auto type_err = [&]() -> Value {
    runtime_error(e.line, fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op, type_name(a), type_name(b)));
  };
  if (a.is_undefined() || b.is_undefined())
    runtime_error(e.line, fmt::format("'{}' is undefined", a.is_undefined() ? a.s : b.s));
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      check_size(a.s.size() + b.s.size());
      return Value::string(a.s + b.s);
    }
    if (a.kind == Kind::Array && b.kind == Kind::Array) {
      Array out = *a.arr;
      out.insert(out.end(), b.arr->begin(), b.arr->end());
      return Value::array(std::move(out));
    }
  }
  if (op == "*" && ((a.is_string() && b.kind == Kind::Int) || (b.is_string() && a.kind == Kind::Int))) {
    const std::string& s = a.is_string() ? a.s : b.s;
    const int64_t n = std::max<int64_t>(0, a.is_string() ? b.i : a.i);
    check_size(s.size() * (size_t)n);
    std::string out;
    for (int64_t k = 0; k < n; ++k) out += s;
    return Value::string(std::move(out));
  }
  if (!a.is_number() || !b.is_number()) {
    if (op == "%" && a.is_string())
      throw JinjaError(fmt::format("chat template line {}: '%' string formatting is not supported", e.line), true);
    return type_err();
  }
  const bool ints = a.kind != Kind::Float && b.kind != Kind::Float;
  const int64_t x = a.kind == Kind::Bool ? a.b : a.i, y = b.kind == Kind::Bool ? b.b : b.i;
  const double fx = a.as_double(), fy = b.as_double();
  int64_t r = 0;
  if (op == "+") return ints ? (__builtin_add_overflow(x, y, &r) ? type_err() : Value::integer(r)) : Value::number(fx + fy);
  if (op == "-") return ints ? (__builtin_sub_overflow(x, y, &r) ? type_err() : Value::integer(r)) : Value::number(fx - fy);
  if (op == "*") return ints ? (__builtin_mul_overflow(x, y, &r) ? type_err() : Value::integer(r)) : Value::number(fx * fy);
  if (op == "/") {
    if (fy == 0) runtime_error(e.line, "division by zero");
    return Value::number(fx / fy);
  }
  if (op == "//" || op == "%") {
    if (ints) {
      if (y == 0) runtime_error(e.line, "integer division or modulo by zero");
      int64_t q = x / y, m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) {
        q -= 1;
        m += y;
      }
      return Value::integer(op == "//" ? q : m);
    }
    if (fy == 0) runtime_error(e.line, "float division by zero");
    const double q = std::floor(fx / fy);
    return Value::number(op == "//" ? q : fx - q * fy);
  }
  if (op == "**") {
    if (ints && y >= 0) {
      int64_t acc = 1;
      for (int64_t k = 0; k < y; ++k)
        if (__builtin_mul_overflow(acc, x, &acc)) return type_err();
      return Value::integer(acc);
    }
    return Value::number(std::pow(fx, fy));
  }
  return type_err();
}

bool Interpreter::compare(const std::string& op, const Value& a, const Value& b, int line) {
  if (op == "==") return equal(a, b);
  if (op == "!=") return !equal(a, b);
  if (op == "in" || op == "not in") {
    bool found = false;
    if (b.is_string()) {
      if (!a.is_string()) runtime_error(line, fmt::format("'in <string>' requires string as left operand, not {}", type_name(a)));
      found = b.s.find(a.s) != std::string::npos;
    } else if (b.kind == Kind::Object || b.kind == Kind::Namespace) {
      found = a.is_string() && b.obj->find(a.s) != nullptr;
    } else if (b.kind == Kind::Array) {
      for (const Value& x : *b.arr) found = found || equal(a, x);
    } else if (!b.is_undefined()) {
      runtime_error(line, fmt::format("argument of type '{}' is not iterable", type_name(b)));
    }
    return op == "in" ? found : !found;
  }
  int c = 0;
  if (a.is_number() && b.is_number()) c = a.as_double() < b.as_double() ? -1 : a.as_double() > b.as_double() ? 1 : 0;
  else if (a.is_string() && b.is_string()) c = a.s.compare(b.s) < 0 ? -1 : a.s == b.s ? 0 : 1;
  else runtime_error(line, fmt::format("'{}' not supported between instances of '{}' and '{}'", op, type_name(a), type_name(b)));
  if (op == "<") return c < 0;
  if (op == ">") return c > 0;
  if (op == "<=") return c <= 0;
  return c >= 0;
}

}  // namespace rl::jinja
