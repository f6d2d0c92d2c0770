#include "backend/cuda/device_memory.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <string>

#include "core/error.h"

namespace ultra {

namespace {

std::atomic<long> g_device_allocs{0};

}  // namespace

DeviceAllocator::~DeviceAllocator() {
  for (void* p : ptrs_) cudaFree(p);
}

void* DeviceAllocator::alloc(size_t bytes, const char* what) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, aligned(std::max<size_t>(bytes, 1)));
  ++g_device_allocs;
  if (e != cudaSuccess) {
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    fail("CUDA: cannot allocate {} for {} ({}; {} of {} free)", cuda::format_mib(bytes), what,
         cudaGetErrorString(e), cuda::format_mib(free_b), cuda::format_mib(total_b));
  }
  ptrs_.push_back(p);
  bytes_ += aligned(bytes);
  return p;
}

long DeviceAllocator::total_calls() {
  return g_device_allocs.load();
}

namespace cuda {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("CUDA: {} failed: {}", what, cudaGetErrorString(e));
}

std::string format_mib(size_t bytes) {
  return fmt::format("{:.1f} MiB", bytes / 1048576.0);
}

}  // namespace cuda

}  // namespace ultra
