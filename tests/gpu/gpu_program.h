// The set-up shared by the GPU test programs and the kernel benchmark (test_cuda_kernels, test_cuda_ops,
// test_cuda_moe, bench_cuda_kernels): whether there is a CUDA device (without one: "SKIPPED: no CUDA device
// (why)" and ctest's skip code in this repo, 77), the output lines that --out DIR also copies to a file, the
// check of CUDA calls outside the kernels under test, and device buffers.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace ultra::test {

constexpr int kSkipExit = 77;

// 0 when a CUDA device is there; else prints why not and returns kSkipExit.
inline int skip_without_device() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaSuccess && n > 0) return 0;
  std::printf("SKIPPED: no CUDA device (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "count 0");
  return kSkipExit;
}

// dir/name opened for writing; null, with a message on stderr, when it cannot be.
inline FILE* open_log(const std::string& dir, const char* name) {
  const std::string path = dir + "/" + name;
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) std::fprintf(stderr, "cannot write %s\n", path.c_str());
  return f;
}

// ---- output: every line to stdout (flushed) and to the program's log file (--out DIR) when it has one

inline FILE* g_log = nullptr;

inline void say(const std::string& s) {
  std::fputs(s.c_str(), stdout);
  std::fflush(stdout);
  if (g_log) std::fputs(s.c_str(), g_log);
}
#if defined(__GNUC__)
__attribute__((format(printf, 1, 2)))
#endif
inline void
say(const char* fmt, ...) {
  char buf[4096];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  say(std::string(buf));
}

// ---- CUDA calls other than the kernel launches under test (allocation, copy, synchronisation)

// Called before the program exits on such a failure (a program's summary line), or null.
inline void (*g_before_fatal)() = nullptr;

// The context may be unusable after a failed call (a kernel fault is sticky), so the program stops here.
[[noreturn]] inline void cuda_fatal(const char* call, const char* file, int line, cudaError_t e) {
  say("FAIL cuda-call %s:%d %s -> %s\n", file, line, call, cudaGetErrorString(e));
  if (g_before_fatal) g_before_fatal();
  std::exit(1);
}

}  // namespace ultra::test

#define CK(call)                                                                     \
  do {                                                                               \
    const cudaError_t e_ = (call);                                                   \
    if (e_ != cudaSuccess) ::ultra::test::cuda_fatal(#call, __FILE__, __LINE__, e_); \
  } while (0)

namespace ultra::test {

// ---- device memory

constexpr size_t kTail = 16;  // guard elements past an output (guarded())

// n elements of T in device memory (at least one element is allocated), freed with the buffer.
template <class T>
class DevBuf {
 public:
  DevBuf() = default;
  explicit DevBuf(size_t n) { alloc(n); }
  explicit DevBuf(const std::vector<T>& h) : DevBuf(h.size()) { put(h); }
  DevBuf(DevBuf&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  DevBuf& operator=(DevBuf&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  ~DevBuf() {
    if (p_) cudaFree(p_);
  }
  // (Re)allocates n elements; the old contents are gone.
  void alloc(size_t n) {
    if (p_) cudaFree(p_);
    p_ = nullptr;
    n_ = n;
    CK(cudaMalloc(reinterpret_cast<void**>(&p_), std::max<size_t>(n, 1) * sizeof(T)));
  }
  T* get() const { return p_; }
  size_t size() const { return n_; }
  // h into the first h.size() elements.
  void put(const std::vector<T>& h) {
    if (h.size() > n_)
      cuda_fatal("DevBuf::put (host data larger than the buffer)", __FILE__, __LINE__, cudaErrorInvalidValue);
    CK(cudaMemcpy(p_, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  // The first count elements (all of them by default).
  std::vector<T> all(size_t count) const {
    std::vector<T> h(count);
    CK(cudaMemcpy(h.data(), p_, count * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  std::vector<T> all() const { return all(n_); }
  // Every byte 0xff: NaN for floats, -1 for integers (an element a kernel should write and did not).
  void poison() { CK(cudaMemset(p_, 0xff, std::max<size_t>(n_, 1) * sizeof(T))); }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

// n elements of data (or of fill where data is shorter) followed by kTail guards of value fill.
template <class T>
DevBuf<T> guarded(size_t n, T fill, const std::vector<T>* data = nullptr) {
  std::vector<T> h(n + kTail, fill);
  if (data) std::copy(data->begin(), data->begin() + std::min(n, data->size()), h.begin());
  return DevBuf<T>(h);
}

}  // namespace ultra::test
