// fail(): throws ultra::Error (include/ultra/error.h) with a formatted message. Errors are raised while
// loading or validating input (model files, flags, batches, requests); the CLI prints the message and
// exits non-zero. They are never thrown from inside a backend's step.
#pragma once

#include <fmt/format.h>

#include <string>

#include "ultra/error.h"

namespace ultra {

// fail("{}: tensor '{}' has {} dims, expected {}", path, name, n, 2);
template <typename... Args>
[[noreturn]] inline void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace ultra
