#include "kv/kv_cache.h"

#include <cstring>

#include "core/error.h"

namespace ultra {

KvCache::KvCache(const KvLayout& p) : p_(p) {
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
  uint8_t* k = mem_.data() + 2 * (size_t)il * layer_bytes_;
  return p_.view(k, k + layer_bytes_);
}

void KvCache::poison(int seq, int from) {
  for (int il = 0; il < p_.n_layers; ++il)
    kv_poison(layer(il), seq, from, [](uint8_t* p, size_t n) { std::memset(p, kKvPoisonByte, n); });
}

void KvCache::copy(int from, int to, int n) {
  if (from < 0 || from >= p_.n_slots || to < 0 || to >= p_.n_slots || from == to || n < 0 || n > p_.max_ctx)
    fail("KV cache: cannot copy {} positions of slot {} into slot {} ({} slots of {} positions)", n, from, to,
         p_.n_slots, p_.max_ctx);
  for (int il = 0; il < p_.n_layers; ++il)
    kv_copy(layer(il), from, to, n,
            [](uint8_t* dst, const uint8_t* src, size_t width, size_t height, size_t pitch) {
              for (size_t h = 0; h < height; ++h) std::memcpy(dst + h * pitch, src + h * pitch, width);
            });
}

}  // namespace ultra
