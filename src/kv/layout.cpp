#include "kv/layout.h"

#include "core/huge_pages.h"

namespace ultra {

KvLayerView KvLayout::view(void* k, void* v) const {
  KvLayerView r;
  r.type = type;
  r.k = k;
  r.v = v;
  r.n_slots = n_slots;
  r.n_kv_heads = n_kv_heads;
  r.max_ctx = max_ctx;
  r.head_dim = head_dim;
  return r;
}

KvLayout kv_layout(const HParams& hp, int n_slots, int n_ctx, KvType type) {
  KvLayout l;
  l.n_layers = hp.n_layers;
  l.n_slots = n_slots;
  l.n_kv_heads = hp.n_kv_heads;
  l.max_ctx = n_ctx;
  l.head_dim = hp.head_dim;
  l.type = type == KvType::f32 ? GgmlType::F32 : type == KvType::f16 ? GgmlType::F16 : GgmlType::BF16;
  return l;
}

size_t kv_host_buffer_bytes(const KvLayout& l) {
  return (l.buffer_bytes() + 63) / 64 * 64;
}

size_t kv_cache_bytes(const KvLayout& l, KvMemory mem) {
  if (mem == KvMemory::device) return 2 * (size_t)l.n_layers * l.buffer_bytes();
  return HugePageMemory::mapped_bytes(2 * (size_t)l.n_layers * kv_host_buffer_bytes(l));
}

size_t kv_cache_bytes(const HParams& hp, int n_slots, int n_ctx, KvType type, KvMemory mem) {
  return kv_cache_bytes(kv_layout(hp, n_slots, n_ctx, type), mem);
}

}  // namespace ultra
