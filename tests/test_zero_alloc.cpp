// Zero allocation, proven: every host allocation (malloc, calloc, realloc, aligned_alloc, posix_memalign,
// memalign, free, and so operator new/delete, which call them) on every thread is counted while the
// generation loop runs 64 decode steps after warm-up: forward, KV write, sampling (with penalties and
// logprobs), and delivery of each token to a callback. The count must be exactly 0.
// Under AddressSanitizer the allocator belongs to ASan, so the test is skipped there.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>

#include "backend/cpu/cpu_backend.h"
#include "engine/generate.h"
#include "io/convert.h"

#if defined(__SANITIZE_ADDRESS__)
#define ULTRA_COUNT_ALLOCS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ULTRA_COUNT_ALLOCS 0
#else
#define ULTRA_COUNT_ALLOCS 1
#endif
#else
#define ULTRA_COUNT_ALLOCS 1
#endif

namespace {
std::atomic<bool> g_counting{false};
std::atomic<long> g_allocs{0};
inline void count() {
  if (g_counting.load(std::memory_order_relaxed)) g_allocs.fetch_add(1, std::memory_order_relaxed);
}
}  // namespace

#if ULTRA_COUNT_ALLOCS
extern "C" {
void* __libc_malloc(size_t);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void __libc_free(void*);
void* __libc_memalign(size_t, size_t);

void* malloc(size_t n) {
  count();
  return __libc_malloc(n);
}
void* calloc(size_t a, size_t b) {
  count();
  return __libc_calloc(a, b);
}
void* realloc(void* p, size_t n) {
  count();
  return __libc_realloc(p, n);
}
void free(void* p) {
  if (p) count();
  __libc_free(p);
}
void* aligned_alloc(size_t al, size_t n) {
  count();
  return __libc_memalign(al, n);
}
void* memalign(size_t al, size_t n) {
  count();
  return __libc_memalign(al, n);
}
int posix_memalign(void** out, size_t al, size_t n) {
  count();
  void* p = __libc_memalign(al, n);
  if (!p) return 12;  // ENOMEM
  *out = p;
  return 0;
}
}
#endif

using namespace ultra;
namespace fs = std::filesystem;

namespace {

const fs::path kFixture = fs::path(ULTRA_SOURCE_DIR) / "tests" / "fixtures" / "hf" / "llama_gqa";

// Runs warm-up generation, then counts allocations over a second generation of 64 decode steps.
long allocations_during_decode(const std::string& model_path, GgmlType kv_type, int threads) {
  auto m = load_model(model_path);
  ContextParams cp;
  cp.n_ctx = 128;
  cp.n_threads = threads;
  cp.kv_type = kv_type;
  CpuBackend be(*m, cp);
  Session s(be, 0);
  SamplingParams sp;  // the full sampling chain, not the greedy shortcut
  sp.temperature = 0.9f;
  sp.top_k = 40;
  sp.top_p = 0.9f;
  sp.min_p = 0.02f;
  sp.repeat_penalty = 1.1f;
  sp.presence_penalty = 0.1f;
  sp.frequency_penalty = 0.1f;
  sp.n_probs = 5;
  sp.seed = 42;
  Sampler sampler(sp, m->hp.n_vocab);
  const int32_t prompt[] = {1, 17, 42, 99, 7, 123, 5, 64};
  int32_t delivered[128];
  int n_delivered = 0;
  float logprob_sum = 0;
  auto on_token = [&](int32_t tok, const float* logits) {
    delivered[n_delivered++ % 128] = tok;
    for (int i = 0; i < sampler.n_logprobs(); ++i) logprob_sum += sampler.logprobs()[i].logprob;
    return true;
  };
  generate(s, sampler, prompt, 8, 16, -1, on_token);  // warm-up
  s.crop(0);
  sampler.reset();
  n_delivered = 0;

  g_allocs = 0;
  g_counting = true;
  const GenTimings t = generate(s, sampler, prompt, 8, 65, -1, on_token);  // 64 decode steps
  g_counting = false;
  EXPECT_EQ(t.n_eval, 64);
  EXPECT_EQ(n_delivered, 65);
  return g_allocs.load();
}

TEST(ZeroAlloc, CounterCounts) {
#if !ULTRA_COUNT_ALLOCS
  GTEST_SKIP() << "allocation counting is disabled under AddressSanitizer";
#endif
  g_allocs = 0;
  g_counting = true;
  void* volatile p = std::malloc(16);
  int* volatile q = new int(3);
  g_counting = false;
  std::free(p);
  delete q;
  EXPECT_GE(g_allocs.load(), 2);
}

TEST(ZeroAlloc, DecodeLoopHfF32) {
#if !ULTRA_COUNT_ALLOCS
  GTEST_SKIP() << "allocation counting is disabled under AddressSanitizer";
#endif
  const long n = allocations_during_decode(kFixture.string(), GgmlType::F32, 2);
  std::printf("[zero-alloc] HF f32 weights, f32 KV, 2 threads: %ld allocations in 64 decode steps\n", n);
  EXPECT_EQ(n, 0);
}

TEST(ZeroAlloc, DecodeLoopGgufQ8F16Kv) {
#if !ULTRA_COUNT_ALLOCS
  GTEST_SKIP() << "allocation counting is disabled under AddressSanitizer";
#endif
  const fs::path out = fs::temp_directory_path() / "ultra_zero_alloc_q8.gguf";
  ConvertOptions opt;
  opt.out_type = GgmlType::Q8_0;
  convert_hf_to_gguf(kFixture.string(), out.string(), opt);
  for (int threads : {1, 3}) {
    const long n = allocations_during_decode(out.string(), GgmlType::F16, threads);
    std::printf("[zero-alloc] GGUF q8_0 weights, f16 KV, %d threads: %ld allocations in 64 decode steps\n",
                threads, n);
    EXPECT_EQ(n, 0);
  }
  fs::remove(out);
}

}  // namespace
