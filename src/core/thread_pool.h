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
  void worker(int ith);

  int n_threads_;
  std::vector<std::thread> threads_;
  alignas(64) std::atomic<uint32_t> generation_{0};
  alignas(64) std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  Fn fn_ = nullptr;
  void* ctx_ = nullptr;
};

}  // namespace ultra
