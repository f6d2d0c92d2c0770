// The KV cache's layout, sizing and poisoning, for every backend. The layout is slotted and static: per
// layer one K and one V buffer of [n_slots, n_kv_heads, max_ctx, head_dim] elements (F32, F16 or BF16),
// each slot holding one sequence; a row is one position of one head (head_dim elements). The host cache
// (kv/kv_cache.h) and the CUDA backend's device cache both have this layout and take their sizes from
// kv_cache_bytes(), which the context's memory check and the footprint report read too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/views.h"
#include "model/hparams.h"
#include "ultra/context.h"

namespace ultra {

struct KvLayout {
  int n_layers = 0;
  int n_slots = 1;
  int n_kv_heads = 0;
  int max_ctx = 0;
  int head_dim = 0;
  GgmlType type = GgmlType::F32;  // F32, F16 or BF16 (the host cache takes F32 and F16)

  size_t elem_bytes() const { return type == GgmlType::F32 ? 4 : 2; }
  size_t row_bytes() const { return (size_t)head_dim * elem_bytes(); }  // one position of one head
  // One layer's K (or V) buffer, [n_slots, n_kv_heads, max_ctx, head_dim], exact (no rounding).
  size_t buffer_bytes() const { return (size_t)n_slots * n_kv_heads * max_ctx * row_bytes(); }
  // The byte offset of (slot, head, pos)'s row in a buffer.
  size_t row_offset(int slot, int head, int pos) const {
    return (((size_t)slot * n_kv_heads + head) * max_ctx + pos) * row_bytes();
  }
  // A layer's view over its K and V buffers.
  KvLayerView view(void* k, void* v) const;
};

// The layout of a context's cache: the model's layers and KV heads, n_slots sequences of n_ctx positions.
KvLayout kv_layout(const HParams& hp, int n_slots, int n_ctx, KvType type);

// Where a cache lives, which decides what its footprint counts.
enum class KvMemory {
  host,    // kv/kv_cache.h: 2 * n_layers buffers, each rounded up to 64 bytes, mapped in 2 MiB pages
  device,  // the CUDA backend: 2 * n_layers buffers, exact (the device allocator's alignment not counted)
};

// The bytes of a KV cache (the footprint's "KV cache"): the one sizing function of both backends and of
// the context's memory check.
size_t kv_cache_bytes(const KvLayout& l, KvMemory mem);
size_t kv_cache_bytes(const HParams& hp, int n_slots, int n_ctx, KvType type, KvMemory mem);
// One host buffer: buffer_bytes() rounded up to 64 bytes (a cache line), so every buffer starts on one.
size_t kv_host_buffer_bytes(const KvLayout& l);

// The layers of a cache whose buffers come from alloc(bytes) -> void* (device memory, say), called for each
// layer's K, then its V, buffer_bytes() each: [n_layers] views. Clearing them is the caller's.
template <class Alloc>
std::vector<KvLayerView> kv_allocate(const KvLayout& l, Alloc&& alloc) {
  std::vector<KvLayerView> layers;
  for (int il = 0; il < l.n_layers; ++il) {
    void* k = alloc(l.buffer_bytes());
    void* v = alloc(l.buffer_bytes());
    layers.push_back(l.view(k, v));
  }
  return layers;
}

// Poisoning (tests: testing::poison_kv_past_length): the bytes written are all ones, a NaN in F32, F16 and
// BF16. kv_poison calls fill(dst, n_bytes) once per contiguous range of the layer's K and V that holds the
// positions [from, max_ctx) of slot `seq`: one range per head and buffer.
constexpr uint8_t kKvPoisonByte = 0xFF;
template <class Fill>
void kv_poison(const KvLayerView& v, int seq, int from, Fill&& fill) {
  const KvLayout l{0, v.n_slots, v.n_kv_heads, v.max_ctx, v.head_dim, v.type};
  const size_t n = (size_t)(v.max_ctx - from) * l.row_bytes();
  for (int h = 0; h < v.n_kv_heads; ++h) {
    const size_t at = l.row_offset(seq, h, from);
    fill((uint8_t*)v.k + at, n);
    fill((uint8_t*)v.v + at, n);
  }
}

// Copying a sequence's prefix into another slot (Backend::copy_kv: n > 1 completions of one prompt share its
// prefill). For each of the layer's K and V, kv_copy calls copy(dst, src, width, height, pitch) once: height
// (= n_kv_heads) rows of width bytes (positions [0, n) of one head), consecutive rows pitch bytes apart in
// both dst (slot `to`) and src (slot `from`). from != to, 0 <= n <= max_ctx (checked by the caller).
template <class Copy2D>
void kv_copy(const KvLayerView& v, int from, int to, int n, Copy2D&& copy) {
  const KvLayout l{0, v.n_slots, v.n_kv_heads, v.max_ctx, v.head_dim, v.type};
  const size_t width = (size_t)n * l.row_bytes(), pitch = (size_t)v.max_ctx * l.row_bytes();
  const size_t src = l.row_offset(from, 0, 0), dst = l.row_offset(to, 0, 0);
  copy((uint8_t*)v.k + dst, (const uint8_t*)v.k + src, width, (size_t)v.n_kv_heads, pitch);
  copy((uint8_t*)v.v + dst, (const uint8_t*)v.v + src, width, (size_t)v.n_kv_heads, pitch);
}

}  // namespace ultra
