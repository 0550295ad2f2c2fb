// Helpers shared by the synth tests.
#pragma once
#include <string>

#include "synth/synth.h"
#include "test_util.h"

namespace rl::synth::test_support {

// Writes a tiny-preset model of `recipe` to a scratch file of the test (tag) and returns its path;
// remove it with test::remove_temp.
inline std::string write_tiny_model(const std::string& tag, const std::string& recipe, double router_skew = 0,
                                    ProjectionLayout layout = ProjectionLayout::LegacyFused) {
  Options o;
  o.preset = "tiny";
  o.recipe = recipe;
  o.router_skew = router_skew;
  o.layout = layout;
  const std::string path = test::temp_path(tag, recipe + ".gguf");
  write_model(make_plan(o), path);
  return path;
}

}  // namespace rl::synth::test_support
