// Renders templates with Python's jinja2 (tests/generate/jinja2_render.py, the Hugging Face chat
// environment) so the interpreter's output can be compared with it byte for byte.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace rl::test {

struct Jinja2Result {
  bool ok = false;
  std::string text;  // the rendered text, or jinja2's error
};

struct Jinja2Case {
  std::string template_path;
  nlohmann::ordered_json context;
};

// One python3 run for all cases (a run costs ~100 ms). Fails the test when python3 or jinja2 is
// missing: the comparison is the point of these tests.
inline std::vector<Jinja2Result> render_with_jinja2(const std::vector<Jinja2Case>& cases) {
  nlohmann::ordered_json in = nlohmann::ordered_json::array();
  for (auto& c : cases) in.push_back({{"template", c.template_path}, {"context", c.context}});
  const std::string path = temp_path("jinja2", "cases.json");
  {
    FILE* f = std::fopen(path.c_str(), "wb");
    const std::string text = in.dump();
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
  }
  ShellRun r = run_shell("python3 " + std::string(REDLITE_SOURCE_DIR) + "/tests/generate/jinja2_render.py " + path);
  remove_temp(path);
  std::vector<Jinja2Result> out;
  if (r.exit_code != 0) {
    ADD_FAILURE() << "python3 with jinja2 (python3-jinja2) is needed for this test";
    return out;
  }
  for (auto& e : nlohmann::json::parse(r.out)) {
    Jinja2Result res;
    res.ok = e.contains("ok");
    res.text = res.ok ? e["ok"].get<std::string>() : e["error"].get<std::string>();
    out.push_back(std::move(res));
  }
  return out;
}

inline std::string template_fixture(const std::string& name) {
  return std::string(REDLITE_SOURCE_DIR) + "/tests/generate/templates/" + name;
}

}  // namespace rl::test
