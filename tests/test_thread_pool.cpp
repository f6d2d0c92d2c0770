#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <ctime>
#include <thread>
#include <vector>

#include "core/thread_pool.h"

using namespace ultra;

namespace {

double process_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

}  // namespace

// Every ith in [0, nth) runs exactly once per run(), ith 0 on the calling thread, nth == size(). (Other
// indices normally run on the workers, but the caller takes any a late worker has not claimed yet.)
TEST(ThreadPool, EachThreadRunsOncePerCall) {
  for (int n : {1, 2, 3, 4}) {
    ThreadPool pool(n);
    ASSERT_EQ(pool.size(), n);
    const auto caller = std::this_thread::get_id();
    for (int iter = 0; iter < 2000; ++iter) {
      std::atomic<int> calls[8] = {};
      std::atomic<int> bad{0};
      pool.parallel([&](int ith, int nth) {
        if (nth != n || ith < 0 || ith >= n) bad++;
        if (ith == 0 && std::this_thread::get_id() != caller) bad++;
        calls[ith]++;
      });
      ASSERT_EQ(bad.load(), 0);
      for (int i = 0; i < n; ++i)
        ASSERT_EQ(calls[i].load(), 1) << "n=" << n << " ith=" << i << " iter=" << iter;
    }
  }
}

// Plain (non-atomic) writes made by the workers are visible to the caller when run() returns, and the
// caller's writes before run() are visible to the workers.
TEST(ThreadPool, MemoryVisibility) {
  ThreadPool pool(3);
  std::vector<int64_t> in(3000), out(3000);
  for (int iter = 0; iter < 500; ++iter) {
    for (int i = 0; i < 3000; ++i) in[i] = i * 7 + iter;
    pool.parallel([&](int ith, int nth) {
      int64_t b, e;
      ThreadPool::split(3000, ith, nth, b, e);
      for (int64_t i = b; i < e; ++i) out[i] = in[i] * 2;
    });
    for (int i = 0; i < 3000; ++i) ASSERT_EQ(out[i], (int64_t)(i * 7 + iter) * 2);
  }
}

// Workers that went to sleep (idle longer than the spin window) are woken by the next run().
TEST(ThreadPool, WakesAfterSleeping) {
  ThreadPool pool(3);
  for (int iter = 0; iter < 5; ++iter) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::atomic<int> sum{0};
    pool.parallel([&](int ith, int) { sum += ith + 1; });
    EXPECT_EQ(sum.load(), 1 + 2 + 3);
  }
}

// Indices run concurrently when the workers are awake: ith 0 and ith 1 each wait (bounded) to see the
// other one running.
TEST(ThreadPool, WorkersRunConcurrently) {
  ThreadPool pool(2);
  int concurrent = 0;
  for (int iter = 0; iter < 20; ++iter) {
    std::atomic<bool> in[2] = {false, false};
    std::atomic<int> saw{0};
    pool.parallel([&](int ith, int) {
      in[ith] = true;
      const auto t0 = std::chrono::steady_clock::now();
      while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(50)) {
        if (in[1 - ith]) {
          saw++;
          break;
        }
      }
    });
    concurrent += saw.load() == 2;
  }
  EXPECT_GT(concurrent, 0) << "ith 0 and ith 1 never ran at the same time";
}

// The caller blocks (rather than spinning forever) when a worker is slow, and still sees completion.
TEST(ThreadPool, SlowWorker) {
  ThreadPool pool(2);
  std::atomic<int> done{0};
  pool.parallel([&](int ith, int) {
    if (ith == 1) std::this_thread::sleep_for(std::chrono::milliseconds(30));
    done++;
  });
  EXPECT_EQ(done.load(), 2);
}

// An idle pool sleeps: over 300 ms idle the process uses far less than one core's worth of CPU time.
TEST(ThreadPool, IdlePoolDoesNotSpin) {
  ThreadPool pool(3);
  pool.parallel([](int, int) {});
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // past the spin window
  const double c0 = process_cpu_seconds();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const double used = process_cpu_seconds() - c0;
  EXPECT_LT(used, 0.05) << "idle workers burned " << used << " s of CPU in 0.3 s";
}

// Destruction joins idle (sleeping) and recently busy workers without hanging.
TEST(ThreadPool, DestructorJoins) {
  for (int i = 0; i < 50; ++i) {
    ThreadPool pool(3);
    std::atomic<int> n{0};
    pool.parallel([&](int, int) { n++; });
    EXPECT_EQ(n.load(), 3);
  }
  {
    ThreadPool pool(2);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

TEST(ThreadPool, SplitCoversRange) {
  for (int64_t n : {0, 1, 5, 7, 64, 1000}) {
    for (int nth : {1, 2, 3, 7}) {
      int64_t next = 0;
      for (int ith = 0; ith < nth; ++ith) {
        int64_t b, e;
        ThreadPool::split(n, ith, nth, b, e);
        EXPECT_EQ(b, next);
        EXPECT_LE(b, e);
        next = e;
      }
      EXPECT_EQ(next, n);
    }
  }
}
