// Subcommand registry: each src/cli/<command>.cpp registers itself with a static Registrar, so
// adding a command touches one file.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <string>

namespace rl::cli {

// setup() adds options to `sub` and returns the function that runs the command (exit code).
using SetupFn = std::function<std::function<int()>(CLI::App& sub)>;

struct Registrar {
  Registrar(const char* name, const char* description, SetupFn setup);
};

}  // namespace rl::cli
