// The communication cost of tensor parallelism's steps over src/dist's communicators, run under mpirun:
//   mpirun -np 2 build/bench_comm [--sizes 4096,8192,...] [--iters N] [--split-min-bytes B] [--nccl] [--json]
// For each size n (floats; default: one row of a 4096- and of an 8192-wide model, then prefill chunks of
// 8192-wide rows: 16, 128 and 512 rows), the median, 10th and 90th percentile of the wall time of one
// all_reduce_sum (as a step calls it: in place, rank-order sum) over --iters repetitions after a warm-up,
// timed on rank 0 after a barrier. Bandwidth: the all-reduce's bytes per rank (4 n) over the median time
// (nccl-tests' "algbw"); then the one-row all-gather of a 128256-token vocabulary's logits. --nccl runs the
// same on the NCCL transport (device buffers, one GPU per rank; in builds with ultra_nccl). --json prints one
// JSON object per line instead of the table (bench/comm_netns.sh reads them).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "dist/communicator.h"
#include "ultra/error.h"
#ifdef ULTRA_HAVE_NCCL
#include <cuda_runtime_api.h>

#include "dist/nccl_communicator.h"
#endif

using namespace ultra;

namespace {

struct Stats {
  double p10, p50, p90;  // seconds
};

// Times f() iters times after a warm-up of iters / 10 + 5, every rank in step (each repetition is a
// collective, so the ranks stay within one message latency of each other).
template <class F>
Stats time_it(dist::Communicator& comm, int iters, F&& f) {
  for (int i = 0; i < iters / 10 + 5; ++i) f();
  comm.barrier();
  std::vector<double> t(iters);
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t[i] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  std::sort(t.begin(), t.end());
  return {t[(size_t)iters / 10], t[(size_t)iters / 2], t[(size_t)iters * 9 / 10]};
}

void report(bool json, int rank, const char* transport, const char* op, int size, size_t bytes, int iters,
            const Stats& s) {
  if (rank != 0) return;
  const double gbs = (double)bytes / s.p50 / 1e9;
  if (json)
    std::printf(
        "{\"transport\": \"%s\", \"op\": \"%s\", \"ranks\": %d, \"bytes\": %zu, \"iters\": %d, \"p10_us\": "
        "%.2f, "
        "\"p50_us\": %.2f, \"p90_us\": %.2f, \"algbw_gbs\": %.4f}\n",
        transport, op, size, bytes, iters, s.p10 * 1e6, s.p50 * 1e6, s.p90 * 1e6, gbs);
  else
    std::printf("%-5s %-15s %2d ranks %10zu B  median %9.1f us  (p10 %9.1f, p90 %9.1f)  %8.3f GB/s\n",
                transport, op, size, bytes, s.p50 * 1e6, s.p10 * 1e6, s.p90 * 1e6, gbs);
  std::fflush(stdout);
}

// Fewer repetitions for the large sizes: about 64 MB moved per size at most, at least 20.
int iters_for(size_t bytes, int iters) {
  return (int)std::max<size_t>(
      20, std::min<size_t>((size_t)iters, ((size_t)64 << 20) / std::max<size_t>(bytes, 1)));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"all-reduce latency and bandwidth of src/dist's communicators (run under mpirun)"};
  std::vector<size_t> sizes{4096, 8192, 8192 * 16, 8192 * 128, 8192 * 512};
  int iters = 500;
  bool nccl = false, json = false;
  size_t split_min_bytes = dist::DistOptions{}.split_min_bytes;
  app.add_option("--sizes", sizes, "all-reduce sizes in floats")->delimiter(',');
  app.add_option("--iters", iters, "repetitions per size (fewer for large sizes)")
      ->check(CLI::Range(10, 1000000));
  app.add_option(
      "--split-min-bytes", split_min_bytes,
      "MPI: split all-reduces of 3+ ranks past this many bytes sent per rank (a huge value: never)");
  app.add_flag("--nccl", nccl, "also the NCCL transport (one GPU per rank)");
  app.add_flag("--json", json, "one JSON object per line");
  CLI11_PARSE(app, argc, argv);

  try {
#ifndef ULTRA_HAVE_NCCL
    if (nccl)
      throw Error("--nccl: this build has no NCCL transport (ultra_nccl: the CUDA toolkit's NCCL and MPI)");
#endif
    dist::DistOptions o;
    o.capacity = std::max<size_t>(*std::max_element(sizes.begin(), sizes.end()), 128256);
    o.timeout_s = 120;
    o.split_min_bytes = split_min_bytes;
    auto comm = dist::make_mpi_communicator(o);
    const int rank = comm->rank(), size = comm->size();
    std::vector<float> x(o.capacity, 0.5f);
    for (size_t n : sizes) {
      const int it = iters_for(n * 4, iters);
      const Stats s = time_it(*comm, it, [&] { comm->all_reduce_sum(x.data(), n); });
      report(json, rank, "MPI", "all_reduce_sum", size, n * 4, it, s);
    }
    // A step's one-row all-gather of the vocabulary's logits (Llama 3's 128256 over the ranks).
    {
      const size_t n = std::min<size_t>(o.capacity, (128256 + size - 1) / size);
      std::vector<float> all((size_t)size * n);
      const Stats s = time_it(*comm, iters, [&] { comm->all_gather(x.data(), n, all.data()); });
      report(json, rank, "MPI", "all_gather", size, n * 4, iters, s);
    }
#ifdef ULTRA_HAVE_NCCL
    if (nccl) {
      auto nc = dist::make_nccl_communicator(*comm, o);
      float* d = nullptr;
      if (cudaMalloc(reinterpret_cast<void**>(&d), o.capacity * sizeof(float)) != cudaSuccess)
        throw Error("cudaMalloc failed");
      cudaMemset(d, 0, o.capacity * sizeof(float));
      for (size_t n : sizes) {
        const int it = iters_for(n * 4, iters);
        const Stats s = time_it(*nc, it, [&] { nc->all_reduce_sum(d, n); });
        report(json, rank, "NCCL", "all_reduce_sum", size, n * 4, it, s);
      }
      cudaFree(d);
    }
#endif
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_comm: %s\n", e.what());
    return 1;
  }
  return 0;
}
