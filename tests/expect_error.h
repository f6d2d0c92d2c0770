// expect_error(f, phrase): f must throw ultra::Error whose message contains phrase.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "core/error.h"

namespace ultra::test {

inline void expect_error(const std::function<void()>& f, const std::string& phrase) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing '" << phrase << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(phrase), std::string::npos) << e.what();
  }
}

}  // namespace ultra::test
