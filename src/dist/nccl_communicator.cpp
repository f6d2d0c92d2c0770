// The NCCL transport (nccl_communicator.h).
#include "dist/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "core/error.h"
#include "dist/nccl_sum.h"

namespace ultra::dist {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// This process's rank among the job's ranks on its host (the launchers' variables), else its global rank.
int local_rank(int rank) {
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
    if (const char* s = std::getenv(v)) return std::atoi(s);
  return rank;
}

// Rank 0's unique id, broadcast over the bootstrap (ok = 0: rank 0 could not make one).
struct IdMessage {
  int32_t ok = 0;
  int32_t pad = 0;
  ncclUniqueId id{};
};

class Nccl final : public NcclCommunicator {
 public:
  Nccl(Communicator& boot, const DistOptions& o, int device) : boot_(boot), timeout_s_(o.timeout_s) {
    rank_ = boot.rank();
    size_ = boot.size();
    if (o.capacity == 0 || o.capacity > (size_t{1} << 36))
      fail("NCCL: a communicator's capacity must be 1 .. 2^36 floats (got {})", o.capacity);
    capacity_ = o.capacity;

    try {
      init(device);
    } catch (const Error&) {
      release();
      throw;
    }
  }

  ~Nccl() override {
    cudaSetDevice(device_);
    if (comm_) {
      bool clean = !broken_;
      if (clean) {
        // Finalize flushes the communicator's work; non-blocking, so bounded like the rest.
        try {
          complete("ncclCommFinalize", ncclCommFinalize(comm_), true);
        } catch (const Error&) {
          clean = false;
        }
      }
      if (clean)
        ncclCommDestroy(comm_);
      else
        ncclCommAbort(comm_);  // a collective may still be waiting for a rank that is gone
    }
    if (!broken_) release();  // after a timeout the stream's kernels may never end: leave them to the exit
  }

  const char* name() const override { return "NCCL"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int device() const override { return device_; }
  void set_stream(void* stream) override { stream_ = stream ? (cudaStream_t)stream : own_; }
  void set_async(bool async) override { async_ = async; }

  void all_reduce_sum(float* x, size_t n) override {
    reduce("all_reduce_sum", x, n, ncclFloat, rank_order_sum_f32);
  }
  void all_reduce_sum_bf16(uint16_t* x, size_t n) override {
    reduce("all_reduce_sum_bf16", x, n, ncclBfloat16, rank_order_sum_bf16);
  }
  void all_gather(const float* in, size_t n, float* out) override {
    enter("all_gather", n);
    call("all_gather", ncclAllGather(in, out, n, ncclFloat, comm_, stream_));
    done("all_gather", n);
  }
  void broadcast(void* data, size_t bytes, int root) override {
    if (root < 0 || root >= size_) fail("NCCL broadcast: root {} of {} ranks", root, size_);
    if (bytes > 4 * capacity_)
      fail("NCCL broadcast: {} bytes, more than the capacity ({} bytes)", bytes, 4 * capacity_);
    enter("broadcast", 0);
    call("broadcast", ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, stream_));
    done("broadcast", bytes);
  }
  void barrier() override {
    enter("barrier", 0);
    call("barrier", ncclAllReduce(one_, one_, 1, ncclFloat, ncclSum, comm_, stream_));
    wait_for("barrier", 1);  // a barrier is the host's: always waits
  }
  void wait() override { wait_for("wait", 0); }

  bool settle(double seconds) override {
    if (!broken_ || !timed_out_) return !broken_;
    const auto t0 = Clock::now();
    while (seconds_since(t0) < seconds) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) {
        broken_ = timed_out_ = false;
        return true;
      }
      if (q != cudaErrorNotReady) return false;
      if (const ncclResult_t a = async_error(); a != ncclSuccess && a != ncclInProgress) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    return false;
  }
  bool broken() const override { return broken_; }

  [[noreturn]] void abort(int code) override {
    if (comm_) ncclCommAbort(comm_);  // unblocks this rank's kernels waiting for the others
    comm_ = nullptr;
    boot_.abort(code);
    std::_Exit(code);  // not reached
  }

 private:
  void init(int device) {
    // Every rank reaches the bootstrap's collectives below even when its own setup failed, so that the
    // others learn of it at once instead of at their timeout.
    Communicator& boot = boot_;
    std::string why = setup_device(device);
    float bad = why.empty() ? 0.0f : 1.0f;
    boot.all_reduce_sum(&bad, 1);
    if (!why.empty()) fail("NCCL on rank {} of {}: {}", rank_, size_, why);
    if (bad > 0)
      fail("NCCL on rank {} of {}: another rank has no usable CUDA device (its output says why)", rank_,
           size_);

    IdMessage msg;
    if (rank_ == 0) msg.ok = ncclGetUniqueId(&msg.id) == ncclSuccess;
    boot.broadcast(&msg, sizeof msg, 0);
    if (!msg.ok) fail("NCCL: rank 0 could not make the unique id (ncclGetUniqueId)");

    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;  // creation and enqueues return at once; the waits below are bounded
    ncclResult_t r = ncclCommInitRankConfig(&comm_, size_, msg.id, rank_, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
      comm_ = nullptr;
      fail("NCCL on rank {} of {}: ncclCommInitRankConfig: {}", rank_, size_, ncclGetErrorString(r));
    }
    try {
      complete("ncclCommInitRankConfig", r, true);
    } catch (const Error&) {
      ncclCommAbort(comm_);
      comm_ = nullptr;
      throw;
    }
  }
  void release() {
    if (scratch_) cudaFree(scratch_);
    if (own_) cudaStreamDestroy(own_);
    scratch_ = nullptr;
    own_ = nullptr;
  }

  std::string setup_device(int device) {
    int n_dev = 0;
    cudaError_t e = cudaGetDeviceCount(&n_dev);
    if (e != cudaSuccess || n_dev == 0)
      return std::string("no CUDA device (") + (e != cudaSuccess ? cudaGetErrorString(e) : "none") + ")";
    device_ = device >= 0 ? device : local_rank(rank_) % n_dev;
    if (device_ >= n_dev) return "device " + std::to_string(device_) + " of " + std::to_string(n_dev);
    if ((e = cudaSetDevice(device_)) != cudaSuccess)
      return std::string("cudaSetDevice: ") + cudaGetErrorString(e);
    if ((e = cudaStreamCreateWithFlags(&own_, cudaStreamNonBlocking)) != cudaSuccess)
      return std::string("cudaStreamCreate: ") + cudaGetErrorString(e);
    stream_ = own_;
    // [size, capacity] floats for the gathered blocks past 2 ranks, and one float for the barrier.
    const size_t floats = (size_ > 2 ? (size_t)size_ * capacity_ : 0) + 1;
    if ((e = cudaMalloc(&scratch_, floats * sizeof(float))) != cudaSuccess)
      return "cudaMalloc of " + std::to_string(floats * 4) + " bytes of scratch: " + cudaGetErrorString(e);
    one_ = static_cast<float*>(scratch_) + (floats - 1);
    return {};
  }

  // Every collective's start: refused after an error or an unsettled timeout, or past the capacity; the
  // communicator's device made current (the caller's thread may have another: a server's step thread).
  void enter(const char* what, size_t n) const {
    if (broken_) fail("NCCL {}: the communicator stopped at an earlier error or timeout (end the job)", what);
    if (n > capacity_)
      fail("NCCL {}: {} values, more than the communicator's capacity ({})", what, n, capacity_);
    cudaSetDevice(device_);
  }
  ncclResult_t async_error() const {
    ncclResult_t a = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &a) != ncclSuccess) return ncclInternalError;
    return a;
  }
  [[noreturn]] void nccl_fail(const char* what, ncclResult_t r) {
    broken_ = true;
    const char* last = comm_ ? ncclGetLastError(comm_) : nullptr;
    fail("NCCL {} on rank {} of {}: {}{}{} (another rank may have failed: its output says why)", what, rank_,
         size_, ncclGetErrorString(r), last && *last ? ": " : "", last ? last : "");
  }
  // A call on the non-blocking communicator: ncclInProgress means it is still being set up (enqueued, for a
  // collective); its state is polled until it is done, an error, or the timeout: the collectives' for a
  // collective, at least kLifecycleS for the communicator's creation and finalization (NCCL's topology
  // discovery and connection setup take seconds; a short collective timeout must not fail them).
  static constexpr double kLifecycleS = 120;
  void complete(const char* what, ncclResult_t r, bool lifecycle = false) {
    if (r == ncclSuccess) return;
    if (r != ncclInProgress) nccl_fail(what, r);
    const double limit = lifecycle ? std::max(timeout_s_, kLifecycleS) : timeout_s_;
    const auto t0 = Clock::now();
    for (;;) {
      const ncclResult_t a = async_error();
      if (a == ncclSuccess) return;
      if (a != ncclInProgress) nccl_fail(what, a);
      if (seconds_since(t0) > limit) {
        broken_ = true;
        fail("NCCL {} on rank {} of {}: not done within {} s (a rank did not join, or stopped)", what, rank_,
             size_, limit);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  void call(const char* what, ncclResult_t r) { complete(what, r); }
  // x = the sum over ranks in rank order: ncclAllReduce itself up to 2 ranks (a + b == b + a), else the
  // gathered blocks summed by the kernel.
  template <class T>
  void reduce(const char* what, T* x, size_t n, ncclDataType_t type,
              cudaError_t (*ordered)(const T*, int, size_t, T*, cudaStream_t)) {
    enter(what, n);
    if (size_ <= 2) {
      call(what, ncclAllReduce(x, x, n, type, ncclSum, comm_, stream_));
    } else {
      call(what, ncclAllGather(x, scratch_, n, type, comm_, stream_));
      cuda(what, ordered(static_cast<const T*>(scratch_), size_, n, x, stream_));
    }
    done(what, n);
  }
  void cuda(const char* what, cudaError_t e) {
    if (e != cudaSuccess) {
      broken_ = true;
      fail("NCCL {} on rank {} of {}: CUDA: {}", what, rank_, size_, cudaGetErrorString(e));
    }
  }
  void done(const char* what, size_t n) {
    if (!async_) wait_for(what, n);
  }
  // Polls the stream until its work is done, NCCL reports an error, or the timeout passes.
  void wait_for(const char* what, size_t n) {
    const auto t0 = Clock::now();
    for (long spin = 0;; ++spin) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) cuda(what, q);
      if ((spin & 63) == 63) {
        const ncclResult_t a = async_error();
        if (a != ncclSuccess && a != ncclInProgress) nccl_fail(what, a);
        const double s = seconds_since(t0);
        if (s > timeout_s_) {
          broken_ = timed_out_ = true;
          fail(
              "NCCL {} of {} values on rank {} of {}: no answer within {} s (another rank stopped or died; "
              "its output says why)",
              what, n, rank_, size_, timeout_s_);
        }
        if (s > 1e-3) std::this_thread::sleep_for(std::chrono::microseconds(20));  // leave the core
      }
    }
  }

  Communicator& boot_;
  double timeout_s_;
  int rank_ = 0, size_ = 1, device_ = 0;
  ncclComm_t comm_ = nullptr;
  cudaStream_t own_ = nullptr, stream_ = nullptr;
  void* scratch_ = nullptr;  // [size, capacity] f32 (or bf16) past 2 ranks, then the barrier's float
  float* one_ = nullptr;
  bool async_ = false;
  bool broken_ = false, timed_out_ = false;
};

}  // namespace

std::unique_ptr<NcclCommunicator> make_nccl_communicator(Communicator& bootstrap, const DistOptions& options,
                                                         int device) {
  return std::make_unique<Nccl>(bootstrap, options, device);
}

}  // namespace ultra::dist
