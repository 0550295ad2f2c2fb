// Errors: every failure a user can cause is an rl::Error whose message names the file, key,
// tensor or argument at fault. Front ends print it and exit non-zero (CLI) or answer 4xx/5xx.
#pragma once
#include <fmt/format.h>
#include <stdexcept>
#include <string>

namespace rl {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace rl
