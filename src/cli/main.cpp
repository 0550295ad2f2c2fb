// redlite: the command line front end. Every subcommand lives in its own file (command.h).
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>

#include "cli/command.h"
#include "common/error.h"

namespace rl::cli {
namespace {
struct Entry {
  const char* description;
  SetupFn setup;
};
std::map<std::string, Entry>& registry() {
  static std::map<std::string, Entry> r;
  return r;
}
}  // namespace

Registrar::Registrar(const char* name, const char* description, SetupFn setup) {
  registry()[name] = Entry{description, std::move(setup)};
}

}  // namespace rl::cli

int main(int argc, char** argv) {
  using namespace rl::cli;
  CLI::App app{"Red Lite: Qwen3-Next hybrid MoE inference on CUDA and the CPU", "redlite"};
  app.set_version_flag("--version", std::string("redlite ") + REDLITE_VERSION);
  app.require_subcommand(1);
  std::map<std::string, std::function<int()>> runners;
  for (auto& [name, entry] : registry()) {
    CLI::App* sub = app.add_subcommand(name, entry.description);
    runners[name] = entry.setup(*sub);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (auto* sub : app.get_subcommands()) return runners.at(sub->get_name())();
  } catch (const rl::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 1;
}
