// Slotted static KV cache: per layer one contiguous K and one V buffer of
// [n_slots, n_kv_heads, max_ctx, head_dim] elements (F32 or F16), allocated once at context creation and
// written in place. All layers share one allocation in huge-page memory (core/huge_pages.h): a decode step
// reads every layer's cache, and with 4 KiB pages each 4 KiB of it is a TLB entry. Each slot holds one
// sequence. The cache is storage only: which positions of a slot are valid is the engine's business (a
// sequence's length), so rolling a sequence back is O(1) and never touches the data, and the size never
// changes.
#pragma once

#include <cstdint>

#include "core/huge_pages.h"
#include "core/views.h"

namespace ultra {

struct KvCacheParams {
  int n_layers = 0;
  int n_slots = 1;
  int n_kv_heads = 0;
  int max_ctx = 0;
  int head_dim = 0;
  GgmlType type = GgmlType::F32;  // F32 or F16
};

class KvCache {
 public:
  explicit KvCache(const KvCacheParams& p);  // throws ultra::Error on a bad type or absurd size

  const KvCacheParams& params() const { return p_; }
  KvLayerView layer(int il);
  int capacity() const { return p_.max_ctx; }

  // The memory the cache maps: 2 * n_layers buffers of buffer_bytes(), rounded up to 2 MiB.
  static size_t bytes_for(const KvCacheParams& p);
  size_t bytes() const { return bytes_for(p_); }
  // One layer's K (or V) buffer, [slots, kv_heads, max_ctx, head_dim], rounded up to 64 bytes.
  static size_t buffer_bytes(const KvCacheParams& p);

 private:
  KvCacheParams p_;
  HugePageMemory mem_;      // [n_layers][K, V] blocks of layer_bytes_
  size_t layer_bytes_ = 0;  // buffer_bytes(p_)
};

}  // namespace ultra
