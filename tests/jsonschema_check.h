// Test helper: validation of documents against JSON schemas by python3-jsonschema
// (tests/validate_json_schema.py), for the schema compiler's tests and the server's JSONSchemaBench check.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace ultra::test {

// The Python that has jsonschema: Debian's /usr/bin/python3 (where tools/install-deps.sh puts
// python3-jsonschema) or the first python3 on PATH (a pyenv or virtualenv one); "" when neither has it.
inline std::string python_with_jsonschema() {
  for (const char* py : {"/usr/bin/python3", "python3"}) {
    if (std::system((std::string(py) + " -c 'import jsonschema' > /dev/null 2>&1").c_str()) == 0) return py;
  }
  return "";
}

inline bool have_python_jsonschema() {
  return !python_with_jsonschema().empty();
}

// Runs tests/validate_json_schema.py over JSON lines {"schema", "doc"} (file `cases`, n_docs lines);
// expects every doc valid. The report goes to dir/report.txt.
inline void expect_all_valid(const std::filesystem::path& cases, int n_docs,
                             const std::filesystem::path& dir) {
  const std::filesystem::path script =
      std::filesystem::path(ULTRA_SOURCE_DIR) / "tests" / "validate_json_schema.py";
  const std::filesystem::path report = dir / "report.txt";
  const int rc = std::system(
      (python_with_jsonschema() + " " + script.string() + " " + cases.string() + " > " + report.string())
          .c_str());
  std::ifstream r(report);
  std::stringstream ss;
  ss << r.rdbuf();
  EXPECT_EQ(rc, 0) << ss.str();
  EXPECT_NE(ss.str().find(fmt::format("{} valid of {}", n_docs, n_docs)), std::string::npos) << ss.str();
}

}  // namespace ultra::test
