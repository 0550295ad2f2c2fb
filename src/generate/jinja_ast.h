// The parsed form of a Jinja template: expressions and statements as the interpreter walks them.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "generate/jinja_value.h"

namespace rl::jinja {

// How deeply expressions, blocks and macro calls may nest: the parser refuses deeper templates
// and the interpreter stops a deeper macro recursion, so neither can exhaust the C++ stack.
// The parser counts its own levels: a block is one, a parenthesised or bracketed expression
// about two (about 30 parentheses in all). Real chat templates stay well under 20.
inline constexpr int kMaxNestingDepth = 64;
// Longest run of operators chained at one level (a ~ b ~ ..., x.a.b..., v|f|g...), which still
// nests the parsed tree one level per operator.
inline constexpr int kMaxChainLength = 256;
// Deepest parsed expression tree (levels of operators, calls, subscripts, literals together).
inline constexpr int kMaxExpressionDepth = 256;
// Deepest evaluation at run time (expressions, statements and macro calls stacked): what bounds
// the interpreter's use of the C++ stack (about 6 KiB a level in a sanitizer build).
inline constexpr int kMaxEvalDepth = 512;

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Type { Literal, Name, Attr, Item, Slice, Call, Filter, Test, Unary, Binary, And, Or, Not,
                    Compare, Cond, List, Tuple, Dict };
  Type type = Type::Literal;
  int line = 0;
  Value literal;                      // Literal
  std::string name;                   // Name; Attr's attribute; Filter/Test name; Unary/Binary operator
  std::vector<ExprPtr> args;          // operands: the object first, then call/filter/test arguments
  std::vector<std::string> kwnames;   // Call/Filter/Test: names of the trailing keyword arguments
  std::vector<std::string> ops;       // Compare: the operator between args[k] and args[k+1]
  bool negated = false;               // Test: `is not`
};

struct Stmt;
using Body = std::vector<Stmt>;

struct Stmt {
  enum class Type { Text, Output, If, For, Set, SetBlock, Macro, Break, Continue, FilterBlock, Transparent };
  Type type = Type::Text;
  int line = 0;
  std::string text;                      // Text; Macro name; SetBlock target
  ExprPtr expr;                          // Output; For iterable; Set value; FilterBlock filter chain
  ExprPtr cond;                          // For: the `if` filter
  std::vector<std::string> targets;      // For/Set: names bound (Set with attr: {namespace, attribute})
  bool attr_target = false;              // Set: `set ns.attr = ...`
  std::vector<ExprPtr> conditions;       // If: one per branch (a null one for else)
  std::vector<Body> branches;            // If: bodies, parallel to conditions
  Body body, else_body;                  // For (else_body: the loop ran no iteration); Macro; blocks
  std::vector<std::string> params;       // Macro
  std::vector<ExprPtr> defaults;         // Macro: parallel to params, null where none
};

// Parses `source`. Throws JinjaError: a syntax error names the line; a construct this
// interpreter does not implement (include, extends, call blocks, an unknown filter or test) has
// unsupported set and names it.
Body parse_template(std::string_view source);

}  // namespace rl::jinja
