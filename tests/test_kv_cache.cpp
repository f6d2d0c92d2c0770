// Slotted static KV cache: size from the shape, O(1) crop (rollback) that gives the same logits as never
// having written the dropped tokens, independent slots, and a clear error instead of growth at capacity.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>

#include "engine/backend.h"
#include "engine/model_impl.h"
#include "kv/kv_cache.h"
#include "kv/layout.h"
#include "kv/sequences.h"
#include "ultra/generate.h"

using namespace ultra;
namespace fs = std::filesystem;

namespace {

const fs::path kModel = fs::path(ULTRA_SOURCE_DIR) / "tests" / "fixtures" / "hf" / "llama_gqa";

double max_diff(std::span<const float> a, std::span<const float> b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, (double)std::fabs(a[i] - b[i]));
  return d;
}

TEST(KvCache, SizeAndTypes) {
  KvCacheParams p;
  p.n_layers = 3;
  p.n_slots = 2;
  p.n_kv_heads = 4;
  p.max_ctx = 100;
  p.head_dim = 8;
  p.type = GgmlType::F16;
  KvCache kv(p);
  EXPECT_EQ(KvCache::buffer_bytes(p), 2u * 4 * 100 * 8 * 2);
  EXPECT_EQ(kv.bytes(), (size_t)2 << 20);  // 6 such buffers, in one mapping of whole 2 MiB pages
  EXPECT_EQ(kv.capacity(), 100);
  p.type = GgmlType::Q8_0;
  EXPECT_THROW(KvCache{p}, Error);
}

// One huge-page allocation holds every layer: 2 MiB-aligned, zeroed, and the K and V buffers of all layers
// disjoint (a writer running past its buffer would clobber the next layer), 64-byte aligned and writable.
TEST(KvCache, LayersAreDisjointZeroedAndAligned) {
  KvCacheParams p;
  p.n_layers = 5;
  p.n_slots = 3;
  p.n_kv_heads = 2;
  p.max_ctx = 37;  // an odd size: the buffers are not multiples of 64 bytes
  p.head_dim = 6;
  p.type = GgmlType::F32;
  KvCache kv(p);
  const size_t n = (size_t)p.n_slots * p.n_kv_heads * p.max_ctx * p.head_dim;
  EXPECT_EQ((uintptr_t)kv.layer(0).k % ((uintptr_t)2 << 20), 0u);
  // The footprint the planner is told is what is mapped: whole 2 MiB pages covering every 64-byte-rounded
  // buffer (n * 4 = 5328 bytes is 5376 rounded).
  EXPECT_EQ(KvCache::buffer_bytes(p), 5376u);
  EXPECT_EQ(kv.bytes(), (size_t)2 << 20);
  EXPECT_EQ((uint8_t*)kv.layer(p.n_layers - 1).v + KvCache::buffer_bytes(p) - (uint8_t*)kv.layer(0).k,
            (ptrdiff_t)(2 * p.n_layers * KvCache::buffer_bytes(p)));
  for (int il = 0; il < p.n_layers; ++il) {
    KvLayerView l = kv.layer(il);
    for (void* b : {l.k, l.v}) {
      EXPECT_EQ((uintptr_t)b % 64, 0u);
      const float* f = static_cast<const float*>(b);
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(f[i], 0.0f) << il << " " << i;
    }
    // Fill this layer's K and V with their own marks.
    std::fill_n(static_cast<float*>(l.k), n, 1.0f + 2 * il);
    std::fill_n(static_cast<float*>(l.v), n, 2.0f + 2 * il);
  }
  for (int il = 0; il < p.n_layers; ++il) {
    KvLayerView l = kv.layer(il);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(static_cast<const float*>(l.k)[i], 1.0f + 2 * il) << il << " " << i;
      ASSERT_EQ(static_cast<const float*>(l.v)[i], 2.0f + 2 * il) << il << " " << i;
    }
  }
}

TEST(KvCache, CropBounds) {
  const Model m = Model::load(kModel.string());
  Context ctx(m, {.n_ctx = 16, .n_slots = 2});
  Batch b(16);
  const int32_t t[10] = {5, 9, 13, 17, 21, 25, 29, 33, 37, 41};
  prefill(ctx, b, 1, t);
  EXPECT_EQ(ctx.seq_len(1), 10);
  EXPECT_EQ(ctx.seq_len(0), 0);
  ctx.crop(1, 4);
  EXPECT_EQ(ctx.seq_len(1), 4);
  EXPECT_EQ(std::vector<int32_t>(ctx.seq_tokens(1).begin(), ctx.seq_tokens(1).end()),
            (std::vector<int32_t>{5, 9, 13, 17}));
  EXPECT_THROW(ctx.crop(1, 5), Error);   // cannot "crop" forward
  EXPECT_THROW(ctx.crop(2, 0), Error);   // no such sequence
  EXPECT_THROW(ctx.crop(0, -1), Error);  // negative
}

// kv_cache_bytes is the one sizing function: the host figure (64-byte buffers in 2 MiB pages) is what
// KvCache maps, the device figure is the exact buffers the CUDA backend allocates, and the context's
// footprint (what `ultra run` prints and the memory check compares) is the host figure.
TEST(KvLayout, SizingForBothBackendsAndTheFootprint) {
  HParams hp;
  hp.n_layers = 3;
  hp.n_kv_heads = 1;
  hp.head_dim = 3;
  const KvLayout l = kv_layout(hp, 2, 5, KvType::f16);
  EXPECT_EQ(l.type, GgmlType::F16);
  EXPECT_EQ(l.buffer_bytes(), 2u * 1 * 5 * 3 * 2);  // 60: not a multiple of 64
  EXPECT_EQ(kv_host_buffer_bytes(l), 64u);
  EXPECT_EQ(KvCache::buffer_bytes(l), 64u);
  EXPECT_EQ(kv_cache_bytes(l, KvMemory::device), 2u * 3 * 60);
  EXPECT_EQ(kv_cache_bytes(l, KvMemory::host), (size_t)2 << 20);
  EXPECT_EQ(kv_cache_bytes(hp, 2, 5, KvType::f16, KvMemory::device), 2u * 3 * 60);
  EXPECT_EQ(kv_layout(hp, 1, 1, KvType::f32).elem_bytes(), 4u);
  EXPECT_EQ(kv_layout(hp, 1, 1, KvType::bf16).type, GgmlType::BF16);
  EXPECT_EQ(kv_layout(hp, 1, 1, KvType::bf16).elem_bytes(), 2u);
  // Past one 2 MiB page: 2 layers x 2 buffers of 768 KiB map 4 MiB on the host, 3 MiB on the device.
  hp.n_layers = 2;
  hp.n_kv_heads = 4;
  hp.head_dim = 64;
  const KvLayout big = kv_layout(hp, 3, 256, KvType::f32);  // 3 * 4 * 256 * 64 * 4 = 768 KiB per buffer
  EXPECT_EQ(kv_cache_bytes(big, KvMemory::device), (size_t)3 << 20);
  EXPECT_EQ(kv_cache_bytes(big, KvMemory::host), (size_t)4 << 20);
  // (slot, head, pos) rows: [slots, heads, ctx, head_dim].
  EXPECT_EQ(big.row_offset(0, 0, 1), 256u);
  EXPECT_EQ(big.row_offset(0, 1, 0), 256u * 256);
  EXPECT_EQ(big.row_offset(2, 3, 255) + big.row_bytes(), big.buffer_bytes());

  const Model m = Model::load(kModel.string());
  const HParams& mhp = detail::impl(m).data->hp;
  for (KvType t : {KvType::f32, KvType::f16}) {
    Context ctx(m, {.n_ctx = 96, .n_slots = 3, .kv_type = t});
    EXPECT_EQ(ctx.footprint().kv, kv_cache_bytes(mhp, 3, 96, t, KvMemory::host));
    EXPECT_EQ(plan_cpu_backend(*detail::impl(m).data, ctx.params()).kv, ctx.footprint().kv);
  }
}

// kv_allocate (the CUDA backend's device cache): each layer's K then V from the allocator, buffer_bytes()
// each, in the layout's views.
TEST(KvLayout, AllocateGivesEachLayerItsKAndV) {
  KvLayout l;
  l.n_layers = 3;
  l.n_slots = 2;
  l.n_kv_heads = 4;
  l.max_ctx = 5;
  l.head_dim = 8;
  l.type = GgmlType::BF16;
  std::vector<std::vector<uint8_t>> bufs;
  bufs.reserve(6);
  const std::vector<KvLayerView> layers = kv_allocate(l, [&](size_t bytes) {
    EXPECT_EQ(bytes, 2u * 4 * 5 * 8 * 2);
    return (void*)bufs.emplace_back(bytes).data();
  });
  ASSERT_EQ(layers.size(), 3u);
  ASSERT_EQ(bufs.size(), 6u);
  for (int il = 0; il < 3; ++il) {
    EXPECT_EQ(layers[il].k, bufs[2 * il].data());
    EXPECT_EQ(layers[il].v, bufs[2 * il + 1].data());
    EXPECT_EQ(layers[il].type, GgmlType::BF16);
    EXPECT_EQ(layers[il].n_slots, 2);
    EXPECT_EQ(layers[il].n_kv_heads, 4);
    EXPECT_EQ(layers[il].max_ctx, 5);
    EXPECT_EQ(layers[il].head_dim, 8);
  }
}

// Two layers of three slots, two KV heads, 10 positions of head dimension 4.
KvCacheParams small_params(GgmlType type) {
  return {.n_layers = 2, .n_slots = 3, .n_kv_heads = 2, .max_ctx = 10, .head_dim = 4, .type = type};
}

// f(il, b, s, h, pos, row) for every row of every layer's K (b 0) and V (b 1): row points at its bytes.
template <class F>
void for_each_row(KvCache& kv, const KvCacheParams& p, F&& f) {
  for (int il = 0; il < p.n_layers; ++il)
    for (int b = 0; b < 2; ++b) {
      const uint8_t* d = static_cast<const uint8_t*>(b == 0 ? kv.layer(il).k : kv.layer(il).v);
      for (int s = 0; s < p.n_slots; ++s)
        for (int h = 0; h < p.n_kv_heads; ++h)
          for (int pos = 0; pos < p.max_ctx; ++pos) f(il, b, s, h, pos, d + p.row_offset(s, h, pos));
    }
}

// Poisoning writes all-ones bytes (NaN) over positions [from, max_ctx) of one slot, every head, K and V of
// every layer, and nothing else.
TEST(KvLayout, PoisonCoversExactlyTheSlotsPositionsPastFrom) {
  for (GgmlType type : {GgmlType::F32, GgmlType::F16}) {
    const KvCacheParams p = small_params(type);
    KvCache kv(p);
    const size_t elem = type == GgmlType::F32 ? 4 : 2, row = p.head_dim * elem;
    const size_t n = (size_t)p.n_slots * p.n_kv_heads * p.max_ctx * row;
    for (int il = 0; il < p.n_layers; ++il) {
      std::memset(kv.layer(il).k, 0x11, n);
      std::memset(kv.layer(il).v, 0x22, n);
    }
    int ranges = 0;
    kv_poison(kv.layer(0), 1, 6, [&](uint8_t*, size_t bytes) {
      EXPECT_EQ(bytes, 4 * row);
      ++ranges;
    });
    EXPECT_EQ(ranges, 2 * p.n_kv_heads);
    kv.poison(1, 6);
    for_each_row(kv, p, [&](int il, int b, int s, int h, int pos, const uint8_t* d) {
      const uint8_t want = s == 1 && pos >= 6 ? 0xFF : b == 0 ? 0x11 : 0x22;
      for (size_t i = 0; i < row; ++i)
        ASSERT_EQ(d[i], want) << il << " " << b << " " << s << " " << h << " " << pos;
    });
    // The poisoned values read as NaN.
    const size_t at = ((size_t)1 * p.n_kv_heads * p.max_ctx + 7) * row;
    if (type == GgmlType::F32) {
      EXPECT_TRUE(std::isnan(*reinterpret_cast<const float*>((const uint8_t*)kv.layer(1).v + at)));
    } else {
      uint16_t h;
      std::memcpy(&h, (const uint8_t*)kv.layer(1).v + at, 2);
      EXPECT_EQ(h & 0x7C00, 0x7C00);  // exponent all ones
      EXPECT_NE(h & 0x03FF, 0);       // mantissa non-zero: NaN
    }
  }
}

// Copying a slot's prefix: positions [0, n) of slot `from` land in slot `to` (every head, K and V, every
// layer), byte for byte; the rest of `to` and every other slot keep their bytes; bad slots and lengths throw.
TEST(KvCache, CopyTakesExactlyTheSourcePrefix) {
  for (GgmlType type : {GgmlType::F32, GgmlType::F16}) {
    const KvCacheParams p = small_params(type);
    KvCache kv(p);
    const size_t row = p.row_bytes(), n = p.buffer_bytes();  // (the layout's, which the poison test checks)
    // Every byte names its (layer, K or V, offset).
    const auto byte_at = [](int il, int b, size_t i) { return (uint8_t)(il * 97 + b * 41 + i * 7 + 1); };
    for (int il = 0; il < p.n_layers; ++il)
      for (size_t i = 0; i < n; ++i) {
        static_cast<uint8_t*>(kv.layer(il).k)[i] = byte_at(il, 0, i);
        static_cast<uint8_t*>(kv.layer(il).v)[i] = byte_at(il, 1, i);
      }
    kv.copy(2, 0, 7);
    for_each_row(kv, p, [&](int il, int b, int s, int h, int pos, const uint8_t* d) {
      const size_t src = p.row_offset(s == 0 && pos < 7 ? 2 : s, h, pos);
      for (size_t i = 0; i < row; ++i)
        ASSERT_EQ(d[i], byte_at(il, b, src + i)) << il << " " << b << " " << s << " " << h << " " << pos;
    });
    kv.copy(0, 1, 0);  // nothing
    EXPECT_THROW(kv.copy(1, 1, 3), Error);
    EXPECT_THROW(kv.copy(3, 1, 3), Error);
    EXPECT_THROW(kv.copy(0, -1, 3), Error);
    EXPECT_THROW(kv.copy(0, 1, 11), Error);
    EXPECT_THROW(kv.copy(0, 1, -1), Error);
  }
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

// Sequences: lengths and tokens by position, O(1) crop that never extends nor touches the tokens, clear
// errors for a sequence out of range.
TEST(Sequences, CropAndBounds) {
  EXPECT_THROW(Sequences(0, 8), Error);
  EXPECT_THROW(Sequences(2, 0), Error);
  Sequences sq(2, 8);
  EXPECT_EQ(sq.n_slots(), 2);
  EXPECT_EQ(sq.n_ctx(), 8);
  EXPECT_EQ(sq.len(0), 0);
  EXPECT_TRUE(sq.held(1).empty());
  for (int i = 0; i < 6; ++i) sq.tokens(1)[i] = 10 + i;
  sq.set_len(1, 6);
  EXPECT_EQ(std::vector<int32_t>(sq.held(1).begin(), sq.held(1).end()),
            (std::vector<int32_t>{10, 11, 12, 13, 14, 15}));
  EXPECT_EQ(sq.token_log() + 8, sq.tokens(1));  // [n_slots, n_ctx]
  EXPECT_EQ(sq.len(0), 0);                      // the other slot is untouched

  sq.crop(1, 2);
  EXPECT_EQ(sq.len(1), 2);
  EXPECT_EQ(sq.held(1).size(), 2u);
  EXPECT_EQ(sq.tokens(1)[4], 14);  // the data past the length stays: crop is O(1)
  sq.crop(1, 2);                   // keeping all of it is allowed
  sq.crop(1, 0);
  EXPECT_EQ(sq.len(1), 0);

  sq.set_len(0, 3);
  EXPECT_EQ(error_of([&] { sq.crop(0, 4); }), "crop: sequence 0 holds 3 tokens, cannot keep 4");
  EXPECT_EQ(error_of([&] { sq.crop(0, -1); }), "crop: sequence 0 holds 3 tokens, cannot keep -1");
  EXPECT_EQ(error_of([&] { sq.crop(2, 0); }), "crop: sequence 2 is out of range [0, 2)");
  EXPECT_EQ(error_of([&] { sq.crop(-1, 0); }), "crop: sequence -1 is out of range [0, 2)");
  EXPECT_EQ(error_of([&] { sq.check_crop(0, 9, "x"); }), "x: sequence 0 holds 3 tokens, cannot keep 9");
  EXPECT_EQ(error_of([&] { sq.check(5, "seq_len"); }), "seq_len: sequence 5 is out of range [0, 2)");
  EXPECT_EQ(sq.len(0), 3);  // no failed call changed anything
}

// A snapshot keeps a length and the sampler settings; restoring it forgets the positions past it and puts
// the settings back. A snapshot longer than the sequence, or with invalid settings, is refused unchanged.
TEST(Sequences, SnapshotRestore) {
  Sequences sq(3, 16);
  SamplingParams a;
  a.temperature = 0.5f;
  a.top_k = 7;
  sq.set_sampling(2, a);
  sq.set_len(2, 5);
  const SeqSnapshot snap = sq.snapshot(2);
  EXPECT_EQ(snap.n_tokens, 5);
  EXPECT_EQ(snap.sampling.top_k, 7);

  SamplingParams b;
  b.temperature = 0.0f;
  sq.set_sampling(2, b);
  sq.set_len(2, 11);
  sq.restore(2, snap);
  EXPECT_EQ(sq.len(2), 5);
  EXPECT_EQ(sq.sampling(2).top_k, 7);
  EXPECT_EQ(sq.sampling(2).temperature, 0.5f);
  EXPECT_EQ(sq.sampling(0).top_k, SamplingParams{}.top_k);  // other sequences untouched

  SeqSnapshot longer = snap;
  longer.n_tokens = 6;
  EXPECT_EQ(error_of([&] { sq.restore(2, longer); }), "restore: sequence 2 holds 5 tokens, the snapshot 6");
  SeqSnapshot negative = snap;
  negative.n_tokens = -1;
  EXPECT_THROW(sq.restore(2, negative), Error);
  SeqSnapshot bad = snap;
  bad.n_tokens = 1;
  bad.sampling.top_p = 2.0f;
  EXPECT_NE(error_of([&] { sq.restore(2, bad); }).find("top_p"), std::string::npos);
  EXPECT_EQ(error_of([&] { sq.restore(3, snap); }), "restore: sequence 3 is out of range [0, 3)");
  EXPECT_EQ(error_of([&] { (void)sq.snapshot(-1); }), "snapshot: sequence -1 is out of range [0, 3)");
  EXPECT_EQ(sq.len(2), 5);  // the refused restores changed nothing
  EXPECT_EQ(sq.sampling(2).top_k, 7);

  SamplingParams invalid;
  invalid.temperature = -1.0f;
  EXPECT_THROW(sq.set_sampling(1, invalid), Error);
  EXPECT_EQ(error_of([&] { sq.set_sampling(3, a); }), "set_sampling: sequence 3 is out of range [0, 3)");
  EXPECT_EQ(sq.sampling(1).temperature, SamplingParams{}.temperature);
  sq.restore(2, sq.snapshot(2));  // restoring the current state is a no-op
  EXPECT_EQ(sq.len(2), 5);
}

class KvSession : public ::testing::TestWithParam<KvType> {};

TEST_P(KvSession, CropThenContinueEqualsFreshRun) {
  const Model m = Model::load(kModel.string());
  Context ctx(m, {.n_ctx = 32, .n_slots = 2, .kv_type = GetParam()});
  Batch b(16);
  const int32_t seq1[] = {5, 9, 13, 17, 21, 25, 29, 33, 37, 41};
  const int32_t seq2[] = {5, 9, 13, 17, 21, 100, 200, 300};
  prefill(ctx, b, 0, seq1);
  ctx.crop(0, 5);  // drop 25..41 but keep the first five
  EXPECT_EQ(ctx.seq_len(0), 5);
  int row = prefill(ctx, b, 0, std::span(seq2).subspan(5), Output::logits);
  const auto l = ctx.logits(row);
  const std::vector<float> rolled(l.begin(), l.end());

  row = prefill(ctx, b, 1, seq2, Output::logits);  // a fresh run of seq2 in the other slot
  EXPECT_LT(max_diff(rolled, ctx.logits(row)), 1e-5);

  // The slots did not disturb each other: decoding the same token in both gives the same logits.
  b.clear();
  b.add(7, 8, 0, Output::logits);
  b.add(7, 8, 1, Output::logits);
  ctx.step(b);
  EXPECT_LT(max_diff(ctx.logits(0), ctx.logits(1)), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Types, KvSession, ::testing::Values(KvType::f32, KvType::f16));

TEST(KvSession, FullContextIsAnErrorNotAResize) {
  const Model m = Model::load(kModel.string());
  Context ctx(m, {.n_ctx = 8});
  Batch b(16);
  const int32_t t[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  EXPECT_THROW(prefill(ctx, b, 0, t), Error);
  EXPECT_EQ(ctx.seq_len(0), 0);  // the step that did not fit wrote nothing
  prefill(ctx, b, 0, std::span(t).first(8));
  EXPECT_EQ(ctx.seq_len(0), 8);
  try {
    prefill(ctx, b, 0, std::span(t).first(1));
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not fit"), std::string::npos) << e.what();
  }
}

}  // namespace
