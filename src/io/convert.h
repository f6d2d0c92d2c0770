// HF -> GGUF conversion (the public entry point is include/ultra/convert.h); parse_out_type for the
// internals that name a type.
#pragma once

#include <string>

#include "core/dtype.h"
#include "ultra/convert.h"

namespace ultra {

GgmlType parse_out_type(
    const std::string& s);  // "f32" | "f16" | "bf16" | "q8_0" | "fp8" | "ternary" | "tq1_0" | "tq2_0"

}  // namespace ultra
