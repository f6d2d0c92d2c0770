// The one error type of the library. Everything that can go wrong with input — a model file, a flag, a
// batch, a request — is reported by throwing ultra::Error with a complete, human-readable message (the
// file, the tensor or field, what was expected and what was found). Nothing is written or changed by an
// operation that throws for bad input.
#pragma once

#include <stdexcept>
#include <string>

namespace ultra {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

}  // namespace ultra
