#include "generate/jinja_template.h"

#include "generate/jinja_builtins.h"

namespace rl::jinja {

JinjaTemplate JinjaTemplate::parse(std::string_view source) {
  JinjaTemplate t;
  t.body_ = std::make_shared<const Body>(parse_template(source));
  return t;
}

std::string JinjaTemplate::render(const nlohmann::ordered_json& context, const RenderLimits& limits) const {
  Value globals = Value::object();
  add_global_functions(*globals.obj);
  if (!context.is_object()) throw JinjaError("chat template context must be a JSON object");
  for (auto& [k, v] : context.items()) globals.obj->set(k, from_json(v));
  Interpreter in(*body_, limits);
  return in.render(globals);
}

}  // namespace rl::jinja
