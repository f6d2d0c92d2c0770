// The host KV cache (CPU backend): the slotted layout of kv/layout.h, per layer one contiguous K and one V
// buffer, allocated once at context creation and written in place. All layers share one allocation in
// huge-page memory (core/huge_pages.h): a decode step reads every layer's cache, and with 4 KiB pages each
// 4 KiB of it is a TLB entry. The cache is storage only: which positions of a slot are valid is the
// sequences' business (kv/sequences.h), so rolling a sequence back is O(1) and never touches the data, and
// the size never changes.
#pragma once

#include <cstdint>

#include "core/huge_pages.h"
#include "core/views.h"
#include "kv/layout.h"

namespace ultra {

using KvCacheParams = KvLayout;  // type F32 or F16

class KvCache {
 public:
  explicit KvCache(const KvLayout& p);  // throws ultra::Error on a bad type or absurd size

  const KvLayout& params() const { return p_; }
  KvLayerView layer(int il);
  int capacity() const { return p_.max_ctx; }

  // The memory the cache maps: kv_cache_bytes(p, KvMemory::host).
  static size_t bytes_for(const KvLayout& p) { return kv_cache_bytes(p, KvMemory::host); }
  size_t bytes() const { return bytes_for(p_); }
  // One layer's K (or V) buffer, [slots, kv_heads, max_ctx, head_dim], rounded up to 64 bytes.
  static size_t buffer_bytes(const KvLayout& p) { return kv_host_buffer_bytes(p); }

  // Fills positions [from, max_ctx) of slot seq with NaN in every layer (kv_poison).
  void poison(int seq, int from);
  // Copies positions [0, n) of slot `from` into slot `to` in every layer's K and V (kv_copy); the rest of
  // slot `to` is left as it was. Throws ultra::Error on a slot out of range, from == to or n outside
  // [0, max_ctx].
  void copy(int from, int to, int n);

 private:
  KvLayout p_;
  HugePageMemory mem_;      // [n_layers][K, V] blocks of layer_bytes_
  size_t layer_bytes_ = 0;  // buffer_bytes(p_)
};

}  // namespace ultra
