// Persistent thread pool: n-1 worker threads created once, plus the calling thread as thread 0.
// run() hands every thread the same function and waits for all of them; it allocates nothing, takes no
// lock on the fast path (workers spin briefly on an atomic generation counter, then sleep on a futex-like
// wait), so it can be used inside the decode step.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace ultra {

class ThreadPool {
 public:
  using Fn = void (*)(void* ctx, int ith, int nth);

  explicit ThreadPool(int n_threads);  // n_threads >= 1; 1 means: run on the caller only
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Runs fn(ctx, ith, nth) for ith in [0, nth) (ith 0 on the caller) and returns when all are done.
  void run(Fn fn, void* ctx);

  // f(ith, nth) on every thread. f is passed by reference: no copy, no allocation.
  template <class F>
  void parallel(F&& f) {
    run([](void* c, int ith, int nth) { (*static_cast<std::remove_reference_t<F>*>(c))(ith, nth); },
        (void*)&f);
  }

  // Splits [0, n) into nth contiguous chunks; returns thread ith's [begin, end).
  static void split(int64_t n, int ith, int nth, int64_t& begin, int64_t& end) {
    const int64_t per = (n + nth - 1) / nth;
    begin = std::min<int64_t>(n, per * ith);
    end = std::min<int64_t>(n, begin + per);
  }

 private:
  // Threads claim work indices ith from claim_ instead of owning a fixed one: ith 0 is the caller's, and
  // any index not yet claimed when the caller is done with its own is run by the caller too, so a worker
  // that is descheduled or slow to wake (busy machine) never stalls run(). An index runs exactly once; fn
  // must therefore not wait for other indices of the same call (no barriers inside fn).
  bool try_claim(uint32_t gen, int& ith);
  void worker(int id);

  int n_threads_;
  std::vector<std::thread> threads_;
  alignas(64) std::atomic<uint32_t> generation_{0};  // futex word: bumped by every run()
  alignas(64) std::atomic<uint64_t> claim_{0};       // (generation << 32) | next index to hand out
  alignas(64) std::atomic<int> pending_{0};          // indices of this run not finished (futex word)
  std::atomic<bool> caller_sleeping_{false};         // the caller gave up spinning and blocks on pending_
  alignas(64) std::atomic<int> sleepers_{0};         // workers blocked (or about to block) on generation_
  std::atomic<bool> stop_{false};
  Fn fn_ = nullptr;
  void* ctx_ = nullptr;
};

}  // namespace ultra
