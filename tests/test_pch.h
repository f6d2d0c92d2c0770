// The precompiled header of the test executables (CMakeLists.txt: built once, reused by every test): the
// headers most test files include, so that each file does not parse them again.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "io/gguf.h"
