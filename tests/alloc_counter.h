// Counts every host allocation of the process (malloc, calloc, realloc, aligned_alloc, posix_memalign,
// memalign, free; operator new/delete call them) while g_counting is set, by replacing the C allocator's
// entry points: on every thread (g_allocs), and on the threads that asked (g_allocs_mine); g_alloc_bytes sums
// the bytes requested (frees add nothing). Include in exactly one file of a test executable; AllocCount
// counts over a scope. Under AddressSanitizer the allocator belongs to ASan: ULTRA_COUNT_ALLOCS is 0, nothing
// is replaced and nothing is counted (tests that assert on the counts skip).
#pragma once

#include <atomic>
#include <cstddef>

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
inline std::atomic<bool> g_counting{false};
inline std::atomic<long> g_allocs{0};                // on every thread
inline std::atomic<long> g_allocs_mine{0};           // on threads that called count_this_thread()
inline std::atomic<unsigned long> g_alloc_bytes{0};  // bytes requested, every thread
inline thread_local bool t_mine = false;
inline void count_this_thread() {
  t_mine = true;
}
inline void count(size_t bytes = 0) {
  if (g_counting.load(std::memory_order_relaxed)) {
    g_allocs.fetch_add(1, std::memory_order_relaxed);
    g_alloc_bytes.fetch_add(bytes, std::memory_order_relaxed);
    if (t_mine) g_allocs_mine.fetch_add(1, std::memory_order_relaxed);
  }
}
// Counting from construction to destruction (or stop()); allocs() and bytes() are the counts since
// construction (allocations and frees; bytes requested). Not nestable: it resets the counters.
struct AllocCount {
  AllocCount() {
    g_allocs = 0;
    g_allocs_mine = 0;
    g_alloc_bytes = 0;
    g_counting = true;
  }
  ~AllocCount() { stop(); }
  AllocCount(const AllocCount&) = delete;
  AllocCount& operator=(const AllocCount&) = delete;
  void stop() { g_counting = false; }
  long allocs() const { return g_allocs.load(); }
  unsigned long bytes() const { return g_alloc_bytes.load(); }
};
}  // namespace

#if ULTRA_COUNT_ALLOCS
extern "C" {
void* __libc_malloc(size_t);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void __libc_free(void*);
void* __libc_memalign(size_t, size_t);

void* malloc(size_t n) {
  count(n);
  return __libc_malloc(n);
}
void* calloc(size_t a, size_t b) {
  count(a * b);
  return __libc_calloc(a, b);
}
void* realloc(void* p, size_t n) {
  count(n);
  return __libc_realloc(p, n);
}
void free(void* p) {
  if (p) count();
  __libc_free(p);
}
void* aligned_alloc(size_t al, size_t n) {
  count(n);
  return __libc_memalign(al, n);
}
void* memalign(size_t al, size_t n) {
  count(n);
  return __libc_memalign(al, n);
}
int posix_memalign(void** out, size_t al, size_t n) {
  count(n);
  void* p = __libc_memalign(al, n);
  if (!p) return 12;  // ENOMEM
  *out = p;
  return 0;
}
}
#endif
