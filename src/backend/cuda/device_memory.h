// The CUDA backend's device memory: one counting allocator that every device buffer of a backend comes from
// (all of them at construction, sized by size_plan.h), and the error check of its host code.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
#include <vector>

namespace ultra {

// Device memory of one backend: every allocation goes through here and is counted; all of them happen at
// construction.
class DeviceAllocator {
 public:
  static constexpr size_t kAlign = 256;  // every allocation is rounded up to this (and aligned to it)
  static size_t aligned(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

  DeviceAllocator() = default;
  ~DeviceAllocator();
  DeviceAllocator(const DeviceAllocator&) = delete;
  DeviceAllocator& operator=(const DeviceAllocator&) = delete;

  void* alloc(size_t bytes, const char* what);  // 256-byte aligned; throws ultra::Error naming `what`
  template <class T>
  T* alloc_n(size_t n, const char* what) {
    return static_cast<T*>(alloc(n * sizeof(T), what));
  }
  int n_allocs() const { return (int)ptrs_.size(); }
  size_t bytes() const { return bytes_; }  // the sum of aligned(bytes) over the allocations
  // cudaMalloc calls made through any DeviceAllocator of this process (tests).
  static long total_calls();

 private:
  std::vector<void*> ptrs_;
  size_t bytes_ = 0;
};

namespace cuda {

// Throws ultra::Error "CUDA: <what> failed: <error>" unless e is cudaSuccess.
void check(cudaError_t e, const char* what);
// "12.3 MiB" (error messages).
std::string format_mib(size_t bytes);

}  // namespace cuda

}  // namespace ultra
