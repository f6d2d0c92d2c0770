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
  explicit Error(const std::string& msg, bool rank0_reports = false)
      : std::runtime_error(msg), rank0_reports_(rank0_reports) {}

  // True on a rank other than 0 of a model split over ranks (LoadParams::tp) when rank 0 throws the same
  // error (a split every rank refuses alike): a program running every rank reports it once, from rank 0.
  bool rank0_reports() const { return rank0_reports_; }

 private:
  bool rank0_reports_ = false;
};

}  // namespace ultra
