// The start shared by the GPU test programs (test_cuda_kernels, test_cuda_ops): whether there is a CUDA
// device (without one: "SKIPPED: no CUDA device (why)" and ctest's skip code in this repo, 77), and the file
// that --out DIR copies the program's lines to.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdio>
#include <string>

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

}  // namespace ultra::test
