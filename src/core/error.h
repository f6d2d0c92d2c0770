// Errors raised while loading or validating input (model files, flags, requests).
// They carry a full human-readable message (file, tensor, expected vs found); the CLI prints it and exits
// non-zero. They are never thrown from the decode step.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace ultra {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

// fail("{}: tensor '{}' has {} dims, expected {}", path, name, n, 2);
template <typename... Args>
[[noreturn]] inline void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace ultra
