// Views of the memory a forward step reads: weight matrices and one layer of the KV cache. They are plain
// descriptions (pointer, type, shape); the memory may be host or device memory, whichever the owner of
// the view allocated. Kernels of every backend take them; model and KV-cache code builds them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace ultra {

// A weight matrix [rows, cols], row-major, element type F32 / F16 / BF16 / Q8_0 (cols % 32 == 0 for Q8_0).
// Row r starts at (const uint8_t*)data + r * row_bytes. This is GGUF's layout (ne[0] = cols) and
// safetensors' (shape [rows, cols]).
struct WeightView {
  GgmlType type = GgmlType::F32;
  const void* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  size_t row_bytes = 0;
};

// One layer of the slotted KV cache: [n_slots, n_kv_heads, max_ctx, head_dim], element type F32 or F16.
struct KvLayerView {
  GgmlType type = GgmlType::F32;
  void* k = nullptr;
  void* v = nullptr;
  int n_slots = 0;
  int n_kv_heads = 0;
  int max_ctx = 0;
  int head_dim = 0;
};

}  // namespace ultra
