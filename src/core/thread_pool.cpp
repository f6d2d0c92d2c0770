#include "core/thread_pool.h"

#include <immintrin.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <climits>

namespace ultra {

namespace {

// How long an idle worker (or the waiting caller) spins before it blocks on the futex. Long enough to
// cover the gap between two kernels of one decode step, short enough that an idle pool sleeps.
constexpr auto kSpin = std::chrono::microseconds(50);

// Spins until pred() holds or kSpin has passed; true if pred() held. The clock is read every 64 pauses.
template <class Pred>
bool spin_until(Pred pred) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (pred()) return true;
      _mm_pause();
    }
    if (std::chrono::steady_clock::now() - start > kSpin) return pred();
  }
}

// Raw futex on a 32-bit atomic (Linux): explicit semantics, no hashed waiter pool.
// futex_wait returns at once if *a != expected, so a store + wake can never be missed.
template <class T>
void futex_wait(std::atomic<T>& a, T expected) {
  static_assert(sizeof(T) == 4 && sizeof(std::atomic<T>) == 4);
  syscall(SYS_futex, reinterpret_cast<T*>(&a), FUTEX_WAIT_PRIVATE, expected, nullptr, nullptr, 0);
}
template <class T>
void futex_wake(std::atomic<T>& a, int n) {
  syscall(SYS_futex, reinterpret_cast<T*>(&a), FUTEX_WAKE_PRIVATE, n, nullptr, nullptr, 0);
}

}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads < 1 ? 1 : n_threads) {
  threads_.reserve(n_threads_ - 1);
  for (int i = 1; i < n_threads_; ++i) threads_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_seq_cst);
  generation_.fetch_add(1, std::memory_order_seq_cst);
  futex_wake(generation_, INT_MAX);
  for (auto& t : threads_) t.join();
}

bool ThreadPool::try_claim(uint32_t gen, int& ith) {
  uint64_t c = claim_.load(std::memory_order_acquire);
  for (;;) {
    if ((uint32_t)(c >> 32) != gen || (int)(uint32_t)c >= n_threads_) return false;
    if (claim_.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel, std::memory_order_acquire)) {
      ith = (int)(uint32_t)c;
      return true;
    }
  }
}

void ThreadPool::run(Fn fn, void* ctx) {
  if (n_threads_ == 1) {
    fn(ctx, 0, 1);
    return;
  }
  // No worker touches fn_/ctx_/pending_ here: the previous run finished all its indices, and a late worker
  // of an old generation fails try_claim.
  fn_ = fn;
  ctx_ = ctx;
  pending_.store(n_threads_, std::memory_order_relaxed);
  caller_sleeping_.store(false, std::memory_order_relaxed);
  const uint32_t gen = generation_.load(std::memory_order_relaxed) + 1;
  claim_.store((uint64_t)gen << 32 | 1u, std::memory_order_release);  // index 0 is the caller's
  // seq_cst pairs with the workers' seq_cst increment of sleepers_ before they block: either we see the
  // sleeper and wake it, or it sees the new generation and does not block (no lost wake-up).
  generation_.store(gen, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) futex_wake(generation_, INT_MAX);

  fn(ctx, 0, n_threads_);
  int done = 1;
  for (int ith; try_claim(gen, ith); ++done) fn(ctx, ith, n_threads_);
  if (pending_.fetch_sub(done, std::memory_order_acq_rel) == done) return;

  if (!spin_until([this] { return pending_.load(std::memory_order_acquire) == 0; })) {
    caller_sleeping_.store(true, std::memory_order_seq_cst);
    for (;;) {
      const int p = pending_.load(std::memory_order_seq_cst);
      if (p == 0) break;
      futex_wait(pending_, p);
    }
  }
  std::atomic_thread_fence(std::memory_order_acquire);
}

void ThreadPool::worker(int /*id*/) {
  // The generation at construction (0), not the current one: run() may already have been called before
  // this thread got here, and that call must not be missed.
  uint32_t seen = 0;
  for (;;) {
    if (!spin_until([&] { return generation_.load(std::memory_order_acquire) != seen; })) {
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      while (generation_.load(std::memory_order_seq_cst) == seen) futex_wait(generation_, seen);
      sleepers_.fetch_sub(1, std::memory_order_relaxed);
    }
    seen = generation_.load(std::memory_order_acquire);
    if (stop_.load(std::memory_order_acquire)) return;
    for (int ith; try_claim(seen, ith);) {
      fn_(ctx_, ith, n_threads_);
      if (pending_.fetch_sub(1, std::memory_order_seq_cst) == 1 &&
          caller_sleeping_.load(std::memory_order_seq_cst))
        futex_wake(pending_, 1);
    }
  }
}

}  // namespace ultra
