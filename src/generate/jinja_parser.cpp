// Recursive descent over the token stream, with jinja2's operator precedence (lowest first):
// conditional `a if c else b`, or, and, not, comparisons and `in`, `~`, + -, * / // %, **,
// unary - +, then a primary with its postfixes (.attr, [index], (call)) and filters / tests.
#include <fmt/format.h>

#include "generate/jinja_ast.h"
#include "generate/jinja_builtins.h"
#include "generate/jinja_lexer.h"

namespace rl::jinja {

namespace {

class Parser {
 public:
  explicit Parser(std::vector<Piece> pieces) : pieces_(std::move(pieces)) {}

  Body parse_all() {
    std::string end;
    Body b = parse_body({}, &end);
    return b;
  }

 private:
  std::vector<Piece> pieces_;
  size_t piece_ = 0;
  const std::vector<Token>* toks_ = nullptr;
  size_t tok_ = 0;
  int line_ = 1;
  int depth_ = 0;

  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& parser) : p(parser) {
      if (++p.depth_ > kMaxNestingDepth)
        p.error(fmt::format("nesting deeper than {} levels", kMaxNestingDepth));
    }
    ~DepthGuard() { --p.depth_; }
  };

  // Operators chained without nesting (a ~ b ~ c, x.a.b.c, v|f|g) still build a left-deep tree
  // that evaluation walks recursively: bound its length too.
  void chain_step(int& length) const {
    if (++length > kMaxChainLength) error(fmt::format("an expression chains more than {} operations", kMaxChainLength));
  }

  [[noreturn]] void error(std::string_view what) const {
    throw JinjaError(fmt::format("template syntax error at line {}: {}", line_, what));
  }
  [[noreturn]] void unsupported(std::string_view what) const {
    throw JinjaError(fmt::format("template line {}: {} is not supported", line_, what), true);
  }

  const Token& peek(size_t ahead = 0) const {
    const size_t k = std::min(tok_ + ahead, toks_->size() - 1);
    return (*toks_)[k];
  }
  const Token& next() {
    const Token& t = peek();
    if (tok_ < toks_->size() - 1) ++tok_;
    return t;
  }
  bool at_op(std::string_view op) const { return peek().type == Token::Type::Op && peek().text == op; }
  bool at_name(std::string_view n) const { return peek().type == Token::Type::Name && peek().text == n; }
  bool skip_op(std::string_view op) {
    if (!at_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(std::string_view n) {
    if (!at_name(n)) return false;
    next();
    return true;
  }
  void expect_op(std::string_view op) {
    if (!skip_op(op)) error(fmt::format("expected '{}'", op));
  }
  std::string expect_name() {
    if (peek().type != Token::Type::Name) error("expected a name");
    return next().text;
  }
  void expect_end() {
    if (peek().type != Token::Type::End) error(fmt::format("unexpected '{}' at the end of a tag", peek().text));
  }

  // The tree's depth, found without recursion (the tree may be deeper than is safe to recurse).
  void check_tree_depth(const Expr* root) const {
    if (!root) return;
    std::vector<std::pair<const Expr*, int>> todo{{root, 1}};
    while (!todo.empty()) {
      auto [e, d] = todo.back();
      todo.pop_back();
      if (d > kMaxExpressionDepth) error(fmt::format("an expression nests deeper than {} levels", kMaxExpressionDepth));
      for (const ExprPtr& c : e->args)
        if (c) todo.emplace_back(c.get(), d + 1);
    }
  }
  void check_tree_depth(const Stmt& s) const {
    check_tree_depth(s.expr.get());
    check_tree_depth(s.cond.get());
    for (const ExprPtr& c : s.conditions) check_tree_depth(c.get());
    for (const ExprPtr& d : s.defaults) check_tree_depth(d.get());
  }

  ExprPtr node(Expr::Type t) {
    auto e = std::make_unique<Expr>();
    e->type = t;
    e->line = line_;
    return e;
  }

  // ---- statements ----------------------------------------------------------------------

  // Parses pieces until a statement whose keyword is in `ends`; stores that keyword in *end.
  Body parse_body(std::initializer_list<std::string_view> ends, std::string* end) {
    DepthGuard guard(*this);
    Body body;
    while (piece_ < pieces_.size()) {
      Piece& p = pieces_[piece_++];
      line_ = p.line;
      if (p.kind == Piece::Kind::Text) {
        Stmt s;
        s.type = Stmt::Type::Text;
        s.text = std::move(p.text);
        body.push_back(std::move(s));
        continue;
      }
      toks_ = &p.tokens;
      tok_ = 0;
      if (p.kind == Piece::Kind::Expression) {
        Stmt s;
        s.type = Stmt::Type::Output;
        s.line = line_;
        s.expr = parse_expr();
        expect_end();
        check_tree_depth(s);
        body.push_back(std::move(s));
        continue;
      }
      const std::string kw = expect_name();
      for (std::string_view e : ends)
        if (kw == e) {
          *end = kw;
          return body;
        }
      body.push_back(parse_statement(kw));
      check_tree_depth(body.back());
    }
    if (ends.size() > 0) error(fmt::format("missing {{% {} %}}", *ends.begin()));
    return body;
  }

  Stmt parse_statement(const std::string& kw) {
    Stmt s;
    s.line = line_;
    if (kw == "if") {
      s.type = Stmt::Type::If;
      s.conditions.push_back(parse_expr());
      expect_end();
      std::string end;
      for (;;) {
        s.branches.push_back(parse_body({"elif", "else", "endif"}, &end));
        if (end == "endif") break;
        if (end == "elif") {
          s.conditions.push_back(parse_expr());
        } else {
          s.conditions.push_back(nullptr);
          expect_end();
          s.branches.push_back(parse_body({"endif"}, &end));
          break;
        }
        expect_end();
      }
      expect_end();
    } else if (kw == "for") {
      s.type = Stmt::Type::For;
      do s.targets.push_back(expect_name());
      while (skip_op(","));
      if (!skip_name("in")) error("expected 'in' in a for loop");
      s.expr = parse_or();  // `if` after it filters, so no conditional expression here
      if (skip_name("if")) s.cond = parse_expr();
      if (at_name("recursive")) unsupported("a recursive for loop");
      expect_end();
      std::string end;
      s.body = parse_body({"else", "endfor"}, &end);
      if (end == "else") {
        expect_end();
        s.else_body = parse_body({"endfor"}, &end);
      }
      expect_end();
    } else if (kw == "set") {
      s.targets.push_back(expect_name());
      if (skip_op(".")) {
        s.attr_target = true;
        s.targets.push_back(expect_name());
      } else {
        while (skip_op(",")) s.targets.push_back(expect_name());
      }
      if (skip_op("=")) {
        s.type = Stmt::Type::Set;
        s.expr = parse_tuple_or_expr();
        expect_end();
      } else {
        if (s.attr_target || s.targets.size() != 1) error("a {% set %} block binds one name");
        s.type = Stmt::Type::SetBlock;
        s.text = s.targets[0];
        if (at_op("|")) unsupported("a filtered {% set %} block");
        expect_end();
        std::string end;
        s.body = parse_body({"endset"}, &end);
        expect_end();
      }
    } else if (kw == "macro") {
      s.type = Stmt::Type::Macro;
      s.text = expect_name();
      expect_op("(");
      while (!at_op(")")) {
        s.params.push_back(expect_name());
        s.defaults.push_back(skip_op("=") ? parse_expr() : nullptr);
        if (!skip_op(",")) break;
      }
      expect_op(")");
      expect_end();
      std::string end;
      s.body = parse_body({"endmacro"}, &end);
      if (peek().type == Token::Type::Name) next();  // {% endmacro name %}
      expect_end();
    } else if (kw == "break" || kw == "continue") {
      s.type = kw == "break" ? Stmt::Type::Break : Stmt::Type::Continue;
      expect_end();
    } else if (kw == "filter") {
      s.type = Stmt::Type::FilterBlock;
      auto placeholder = node(Expr::Type::Name);
      placeholder->name = "";  // the block's output, bound by the interpreter
      s.expr = parse_filters(parse_one_filter(std::move(placeholder)));
      expect_end();
      std::string end;
      s.body = parse_body({"endfilter"}, &end);
      expect_end();
    } else if (kw == "generation") {
      // Hugging Face's marker around assistant text (for training masks); renders its body.
      s.type = Stmt::Type::Transparent;
      expect_end();
      std::string end;
      s.body = parse_body({"endgeneration"}, &end);
      expect_end();
    } else if (kw == "elif" || kw == "else" || kw.rfind("end", 0) == 0) {
      error(fmt::format("unexpected {{% {} %}}", kw));
    } else {
      unsupported(fmt::format("the {{% {} %}} statement", kw));
    }
    return s;
  }

  // ---- expressions ---------------------------------------------------------------------

  ExprPtr parse_tuple_or_expr() {
    ExprPtr first = parse_expr();
    if (!at_op(",")) return first;
    auto t = node(Expr::Type::Tuple);
    t->args.push_back(std::move(first));
    while (skip_op(",")) {
      if (peek().type == Token::Type::End) break;
      t->args.push_back(parse_expr());
    }
    return t;
  }

  ExprPtr parse_expr() {
    DepthGuard guard(*this);
    ExprPtr e = parse_or();
    int chain = 0;
    while (skip_name("if")) {
      chain_step(chain);
      auto c = node(Expr::Type::Cond);
      ExprPtr test = parse_or();
      ExprPtr other = skip_name("else") ? parse_expr() : nullptr;
      c->args.push_back(std::move(test));
      c->args.push_back(std::move(e));
      c->args.push_back(std::move(other));
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary(Expr::Type t, std::string op, ExprPtr l, ExprPtr r) {
    auto b = node(t);
    b->name = std::move(op);
    b->args.push_back(std::move(l));
    b->args.push_back(std::move(r));
    return b;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    for (int chain = 0; skip_name("or"); chain_step(chain)) e = binary(Expr::Type::Or, "or", std::move(e), parse_and());
    return e;
  }
  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    for (int chain = 0; skip_name("and"); chain_step(chain)) e = binary(Expr::Type::And, "and", std::move(e), parse_not());
    return e;
  }
  ExprPtr parse_not() {
    if (skip_name("not")) {
      DepthGuard guard(*this);
      auto n = node(Expr::Type::Not);
      n->args.push_back(parse_not());
      return n;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    ExprPtr first = parse_concat();
    ExprPtr cmp;
    for (;;) {
      std::string op;
      const Token& t = peek();
      if (t.type == Token::Type::Op && (t.text == "==" || t.text == "!=" || t.text == "<" || t.text == ">" ||
                                        t.text == "<=" || t.text == ">=")) {
        op = next().text;
      } else if (at_name("in")) {
        next();
        op = "in";
      } else if (at_name("not") && peek(1).type == Token::Type::Name && peek(1).text == "in") {
        next();
        next();
        op = "not in";
      } else {
        break;
      }
      if (!cmp) {
        cmp = node(Expr::Type::Compare);
        cmp->args.push_back(std::move(first));
      }
      if ((int)cmp->ops.size() >= kMaxChainLength) error("too many comparisons in a chain");
      cmp->ops.push_back(op);
      cmp->args.push_back(parse_concat());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }
  ExprPtr parse_concat() {
    ExprPtr e = parse_math1();
    for (int chain = 0; skip_op("~"); chain_step(chain)) e = binary(Expr::Type::Binary, "~", std::move(e), parse_math1());
    return e;
  }
  ExprPtr parse_math1() {
    ExprPtr e = parse_math2();
    for (int chain = 0; at_op("+") || at_op("-"); chain_step(chain)) {
      std::string op = next().text;
      e = binary(Expr::Type::Binary, op, std::move(e), parse_math2());
    }
    return e;
  }
  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    for (int chain = 0; at_op("*") || at_op("/") || at_op("//") || at_op("%"); chain_step(chain)) {
      std::string op = next().text;
      e = binary(Expr::Type::Binary, op, std::move(e), parse_pow());
    }
    return e;
  }
  ExprPtr parse_pow() {
    ExprPtr e = parse_unary();
    for (int chain = 0; skip_op("**"); chain_step(chain)) e = binary(Expr::Type::Binary, "**", std::move(e), parse_unary());
    return e;
  }
  ExprPtr parse_unary() {
    DepthGuard guard(*this);
    return parse_filters(parse_unary_operand());
  }

  // jinja2 applies filters after a unary minus: `-3 | abs` is abs(-3).
  ExprPtr parse_unary_operand() {
    if (at_op("-") || at_op("+")) {
      DepthGuard guard(*this);
      auto u = node(Expr::Type::Unary);
      u->name = next().text;
      u->args.push_back(parse_unary_operand());
      return u;
    }
    return parse_postfix(parse_primary());
  }

  ExprPtr parse_primary() {
    const Token& t = peek();
    auto lit = [&](Value v) {
      auto e = node(Expr::Type::Literal);
      e->literal = std::move(v);
      return e;
    };
    switch (t.type) {
      case Token::Type::Int: return lit(Value::integer(next().i));
      case Token::Type::Float: return lit(Value::number(next().f));
      case Token::Type::String: {
        std::string s;
        while (peek().type == Token::Type::String) s += next().text;  // adjacent literals join
        return lit(Value::string(std::move(s)));
      }
      case Token::Type::Name: {
        std::string n = next().text;
        if (n == "true" || n == "True") return lit(Value::boolean(true));
        if (n == "false" || n == "False") return lit(Value::boolean(false));
        if (n == "none" || n == "None") return lit(Value::none());
        auto e = node(Expr::Type::Name);
        e->name = std::move(n);
        return e;
      }
      case Token::Type::Op:
        if (skip_op("(")) {
          if (skip_op(")")) return node(Expr::Type::Tuple);
          ExprPtr e = parse_expr();
          if (at_op(",")) {
            auto tup = node(Expr::Type::Tuple);
            tup->args.push_back(std::move(e));
            while (skip_op(",") && !at_op(")")) tup->args.push_back(parse_expr());
            e = std::move(tup);
          }
          expect_op(")");
          return e;
        }
        if (skip_op("[")) {
          auto l = node(Expr::Type::List);
          while (!at_op("]")) {
            l->args.push_back(parse_expr());
            if (!skip_op(",")) break;
          }
          expect_op("]");
          return l;
        }
        if (skip_op("{")) {
          auto d = node(Expr::Type::Dict);
          while (!at_op("}")) {
            d->args.push_back(parse_expr());
            expect_op(":");
            d->args.push_back(parse_expr());
            if (!skip_op(",")) break;
          }
          expect_op("}");
          return d;
        }
        break;
      default: break;
    }
    error(t.type == Token::Type::End ? std::string("unexpected end of expression")
                                     : fmt::format("unexpected '{}'", t.text));
  }

  // Call arguments after '(' up to ')': positional first, then name=value.
  void parse_args(Expr& e) {
    while (!at_op(")")) {
      if (peek().type == Token::Type::Name && peek(1).type == Token::Type::Op && peek(1).text == "=") {
        e.kwnames.push_back(next().text);
        next();
        e.args.push_back(parse_expr());
      } else {
        if (!e.kwnames.empty()) error("a positional argument after a keyword argument");
        if (at_op("*") || at_op("**")) unsupported("argument unpacking (*args)");
        e.args.push_back(parse_expr());
      }
      if (!skip_op(",")) break;
    }
    expect_op(")");
  }

  ExprPtr parse_postfix(ExprPtr e) {
    for (int chain = 0;; chain_step(chain)) {
      if (skip_op(".")) {
        auto a = node(Expr::Type::Attr);
        if (peek().type == Token::Type::Int) a->name = std::to_string(next().i);
        else a->name = expect_name();
        a->args.push_back(std::move(e));
        e = std::move(a);
      } else if (skip_op("[")) {
        e = parse_subscript(std::move(e));
      } else if (skip_op("(")) {
        auto c = node(Expr::Type::Call);
        c->args.push_back(std::move(e));
        parse_args(*c);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr obj) {
    ExprPtr parts[3];
    int colons = 0;
    for (;;) {
      if (at_op("]")) break;
      if (skip_op(":")) {
        if (++colons > 2) error("too many ':' in a slice");
        continue;
      }
      if (parts[colons]) error("expected ':' or ']' in a subscript");
      parts[colons] = parse_expr();
    }
    expect_op("]");
    if (colons == 0) {
      if (!parts[0]) error("empty subscript");
      auto i = node(Expr::Type::Item);
      i->args.push_back(std::move(obj));
      i->args.push_back(std::move(parts[0]));
      return i;
    }
    auto s = node(Expr::Type::Slice);
    s->args.push_back(std::move(obj));
    for (auto& p : parts) s->args.push_back(std::move(p));  // null parts are omitted bounds
    return s;
  }

  ExprPtr parse_filters(ExprPtr e) {
    for (int chain = 0;; chain_step(chain)) {
      if (skip_op("|")) {
        e = parse_one_filter(std::move(e));
      } else if (skip_name("is")) {
        auto t = node(Expr::Type::Test);
        t->negated = skip_name("not");
        t->name = expect_name();
        if (!is_known_test(t->name)) unsupported(fmt::format("the test '{}'", t->name));
        t->args.push_back(std::move(e));
        if (skip_op("(")) {
          parse_args(*t);
        } else if (starts_test_argument()) {
          t->args.push_back(parse_postfix(parse_primary()));
        }
        e = std::move(t);
      } else {
        return e;
      }
    }
  }

  // NAME [(args)] after a '|' (or after {% filter %}), applied to `e`.
  ExprPtr parse_one_filter(ExprPtr e) {
    auto f = node(Expr::Type::Filter);
    f->name = expect_name();
    if (!is_known_filter(f->name)) unsupported(fmt::format("the filter '{}'", f->name));
    f->args.push_back(std::move(e));
    if (skip_op("(")) parse_args(*f);
    return f;
  }

  // `x is divisibleby 3`, `x is sameas false`: a test may take one argument without parentheses.
  bool starts_test_argument() const {
    const Token& t = peek();
    if (t.type == Token::Type::Int || t.type == Token::Type::Float || t.type == Token::Type::String) return true;
    if (t.type != Token::Type::Name) return false;
    static const char* kStop[] = {"and", "or", "not", "if", "else", "in", "is"};
    for (const char* s : kStop)
      if (t.text == s) return false;
    return true;
  }
};

}  // namespace

Body parse_template(std::string_view source) {
  Parser p(lex_template(source));
  return p.parse_all();
}

}  // namespace rl::jinja
