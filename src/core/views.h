// Views of the memory a forward step reads: weight matrices and one layer of the KV cache. They are plain
// descriptions (pointer, type, shape); the memory may be host or device memory, whichever the owner of
// the view allocated. Kernels of every backend take them; model and KV-cache code builds them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace ultra {

// A weight matrix [rows, cols], row-major, element type F32 / F16 / BF16 / Q8_0 (cols % 32 == 0 for Q8_0) /
// F8_E4M3 / TERNARY (cols % 16 == 0). Row r starts at (const uint8_t*)data + r * row_bytes. This is GGUF's
// layout (ne[0] = cols) and safetensors' (shape [rows, cols]).
// F8_E4M3 and TERNARY carry f32 scales: element (r, c) is decode(code) * scale[r * scale_row_stride +
// c / scale_group]. scale_row_stride is 0 for one scale for the whole tensor, else the groups per row
// (ceil(cols / scale_group)). F8_E4M3 has one scale per tensor or row (scale_group == cols), or per row and
// 128 columns (HF block-wise checkpoints, the last group may be partial); TERNARY one per tensor, per row or
// per 256 columns (TQ1_0/TQ2_0 repacked), scale_group a multiple of 16 dividing cols.
struct WeightView {
  GgmlType type = GgmlType::F32;
  const void* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  size_t row_bytes = 0;
  const float* scale = nullptr;  // [rows * scale_row_stride] or [1], F8_E4M3 / TERNARY only
  int64_t scale_group = 0;
  int64_t scale_row_stride = 0;
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
