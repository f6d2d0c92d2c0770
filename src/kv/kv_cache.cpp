#include "kv/kv_cache.h"

#include "core/error.h"

namespace ultra {

size_t KvCache::buffer_bytes(const KvCacheParams& p) {
  const size_t elem = p.type == GgmlType::F16 ? 2 : 4;
  return ((size_t)p.n_slots * p.n_kv_heads * p.max_ctx * p.head_dim * elem + 63) / 64 * 64;
}

size_t KvCache::bytes_for(const KvCacheParams& p) {
  return HugePageMemory::mapped_bytes(2 * (size_t)p.n_layers * buffer_bytes(p));
}

KvCache::KvCache(const KvCacheParams& p) : p_(p) {
  if (p.type != GgmlType::F32 && p.type != GgmlType::F16)
    fail("KV cache: unsupported type {} (supported: F32, F16)", type_name(p.type));
  if (p.n_layers <= 0 || p.n_slots <= 0 || p.n_kv_heads <= 0 || p.max_ctx <= 0 || p.head_dim <= 0)
    fail("KV cache: invalid shape (layers {}, slots {}, kv heads {}, ctx {}, head dim {})", p.n_layers,
         p.n_slots, p.n_kv_heads, p.max_ctx, p.head_dim);
  if (p.max_ctx > (1 << 24) || p.n_slots > 4096)
    fail("KV cache: context {} x slots {} is too large", p.max_ctx, p.n_slots);
  layer_bytes_ = buffer_bytes(p);
  mem_ = HugePageMemory(2 * p.n_layers * layer_bytes_, "the KV cache", /*prefault=*/true);
}

KvLayerView KvCache::layer(int il) {
  KvLayerView v;
  v.type = p_.type;
  uint8_t* k = mem_.data() + 2 * (size_t)il * layer_bytes_;
  v.k = k;
  v.v = k + layer_bytes_;
  v.n_slots = p_.n_slots;
  v.n_kv_heads = p_.n_kv_heads;
  v.max_ctx = p_.max_ctx;
  v.head_dim = p_.head_dim;
  return v;
}

}  // namespace ultra
