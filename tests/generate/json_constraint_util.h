// Helpers of the constrained-decoding tests: the schema corpus, and the independent check of
// documents by Python's json and jsonschema (tests/generate/validate_json.py).
#pragma once
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace rl::test {

inline std::vector<nlohmann::ordered_json> schema_corpus() {
  std::ifstream f(std::string(REDLITE_SOURCE_DIR) + "/tests/generate/data/schema_corpus.json");
  return nlohmann::ordered_json::parse(f).get<std::vector<nlohmann::ordered_json>>();
}

struct SchemaCase {
  nlohmann::ordered_json schema;
  std::string text;
};

// Runs the Python validator over `cases`: "" when all parse and validate, else its report.
// Sets `missing` when python3 or jsonschema is not installed.
inline std::string python_validate(const std::vector<SchemaCase>& cases, bool& missing) {
  const std::string path = temp_path("json_constraint", "cases.jsonl");
  {
    std::ofstream out(path);
    for (const SchemaCase& c : cases)
      out << nlohmann::ordered_json{{"schema", c.schema}, {"text", c.text}}
                 .dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace)
          << "\n";
  }
  ShellRun r =
      run_shell("python3 " + std::string(REDLITE_SOURCE_DIR) + "/tests/generate/validate_json.py " + path + " 2>&1");
  remove_temp(path);
  missing = r.exit_code == 2 || r.exit_code == 127;
  return r.exit_code == 0 ? std::string() : r.out;
}

}  // namespace rl::test
