// Walks a parsed template: scopes as jinja2 has them (a for loop and a macro call open their own,
// `if` does not), `loop.*`, namespaces, macros, break/continue, and the limits that keep one
// request's template from running away.
#pragma once
#include <chrono>
#include <string>
#include <vector>

#include "generate/jinja_ast.h"
#include "generate/jinja_value.h"

namespace rl::jinja {

struct RenderLimits {
  // Wall-clock budget for one render; checked every few hundred evaluation steps.
  std::chrono::milliseconds time_budget{2000};
  // Largest output, and largest string one expression may build.
  size_t max_output_bytes = size_t(16) << 20;
  // Macro calls nested deeper than this fail (the parser bounds the template's own nesting).
  int max_call_depth = kMaxNestingDepth;
};

class Interpreter {
 public:
  Interpreter(const Body& program, const RenderLimits& limits);
  // Renders with `globals` (an Object: messages, tools, add_generation_prompt, ...) visible.
  std::string render(const Value& globals);

  // For the builtins: one evaluation step (time check) and the string-size limit.
  void step();
  void check_size(size_t bytes) const;
  Value call(const Value& callee, std::vector<Value>& args, Kwargs& kwargs);

 private:
  struct Frame {
    std::vector<std::pair<std::string, Value>> vars;
    Frame* parent = nullptr;
    Value* find(std::string_view name);
    void set(const std::string& name, Value v);
  };
  enum class Flow { Normal, Break, Continue };

  Flow exec(const Body& body, Frame& frame, std::string& out);
  Flow exec_for(const Stmt& s, Frame& frame, std::string& out);
  void exec_set(const Stmt& s, Frame& frame);
  Value eval(const Expr& e, Frame& frame);
  Value eval_call(const Expr& e, Frame& frame);
  Value eval_binary(const Expr& e, const Value& a, const Value& b);
  bool compare(const std::string& op, const Value& a, const Value& b, int line);
  Value call_macro(const Stmt& macro, std::vector<Value>& args, Kwargs& kwargs);
  void eval_args(const Expr& e, size_t first, Frame& frame, std::vector<Value>& args, Kwargs& kwargs);

  const Body& program_;
  RenderLimits limits_;
  std::chrono::steady_clock::time_point deadline_;
  uint32_t steps_ = 0;
  int call_depth_ = 0;
  int eval_depth_ = 0;  // exec() and eval() frames on the stack
  struct EvalDepth {
    explicit EvalDepth(Interpreter& in);
    ~EvalDepth() { --in_.eval_depth_; }
    Interpreter& in_;
  };
  Frame* root_ = nullptr;
};

[[noreturn]] void runtime_error(int line, std::string_view what);

}  // namespace rl::jinja
