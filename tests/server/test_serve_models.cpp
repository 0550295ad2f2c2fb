// `redlite serve` as a user starts it: /v1/models names the backend and the numeric tier the
// process runs in (--numerics, fast by default), read from the backend the command line opened.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "serve_process.h"
#include "server_test_util.h"

using nlohmann::json;
using namespace rl::test;

namespace {

std::string log_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

json models_meta(const ServeProcess& p) {
  httplib::Client c("127.0.0.1", p.port());
  httplib::Headers auth = {{"Authorization", "Bearer key"}};
  auto r = c.Get("/v1/models", auth);
  if (!r || r->status != 200) return json();
  const json j = json::parse(r->body);
  return j["data"].size() == 1 ? j["data"][0]["meta"] : json();
}

TEST(ServeModels, NamesTheBackendAndTheNumericTier) {
  const std::string log = temp_path("serve-models", "serve.log");
  for (const char* tier : {"", "exact", "fast"}) {
    SCOPED_TRACE(std::string("--numerics ") + tier);
    std::vector<std::string> extra;
    if (*tier) extra = {"--numerics", tier};
    ServeProcess p(server_model(), "key", log, extra);
    ASSERT_TRUE(p.ok());
    ASSERT_TRUE(p.wait_healthy()) << log_text(log);
    const json meta = models_meta(p);
    ASSERT_TRUE(meta.is_object()) << log_text(log);
    EXPECT_EQ(meta["backend"], "cpu");
    EXPECT_EQ(meta["numerics"], *tier ? tier : "fast");  // fast by default
  }
  remove_temp(log);
}

// --step-prefill-tokens: off by default on the cpu backend (its one-pass prefill of several prompts
// gained nothing there, docs/server.md), the given value when set; the start line says which.
TEST(ServeModels, StartLineNamesTheStepPrefillBudget) {
  const std::string log = temp_path("serve-models", "serve.log");
  for (const char* given : {"", "64"}) {
    SCOPED_TRACE(std::string("--step-prefill-tokens ") + given);
    std::vector<std::string> extra;
    if (*given) extra = {"--step-prefill-tokens", given};
    ServeProcess p(server_model(), "key", log, extra);
    ASSERT_TRUE(p.ok());
    ASSERT_TRUE(p.wait_healthy()) << log_text(log);
    const std::string want = std::string("step prefill ") + (*given ? given : "0") + " tokens";
    EXPECT_NE(log_text(log).find(want), std::string::npos) << log_text(log);
  }
  remove_temp(log);
}

}  // namespace
