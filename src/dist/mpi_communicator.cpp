// The MPI transport of communicator.h. Collectives are written over non-blocking point-to-point messages
// (MPI_Isend / MPI_Irecv into the caller's buffers and the scratch made at construction), polled with
// MPI_Testall until they complete or the timeout passes: the wait can end (a collective of the MPI library
// blocks without a bound), and nothing is allocated per call (MPI's own requests come from its free lists).
// With the few ranks of tensor parallelism, every rank exchanges its block with every other rank directly:
// one message latency per collective, (size - 1) * n floats sent and received per rank. A large all-reduce of
// 3 ranks or more (DistOptions::split_min_bytes) is a reduce-scatter (each rank receives every rank's part of
// its own 1 / size chunk and sums it in rank order) and an all-gather of the summed chunks: two latencies,
// 2 (size - 1) / size * n floats per rank, and the same additions in the same order as the direct exchange.
#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "dist/communicator.h"

namespace ultra::dist {

namespace {

int g_users = 0;         // live communicators
bool g_we_init = false;  // MPI_Init_thread was called here (so MPI_Finalize is ours too)

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(const DistOptions& o)
      : timeout_s_(o.timeout_s), split_min_bytes_(o.split_min_bytes) {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
      int provided = 0;
      if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
        fail("MPI: MPI_Init_thread failed");
      g_we_init = true;
    }
    ++g_users;
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    if (o.capacity == 0 || o.capacity > (size_t)INT_MAX / 4)
      fail("MPI: a communicator's capacity must be 1 .. {} floats (got {})", INT_MAX / 4, o.capacity);
    capacity_ = o.capacity;
    scratch_.resize((size_t)size_ * capacity_);
    reqs_.resize(2 * (size_t)size_);
  }
  ~MpiCommunicator() override {
    if (!broken_) MPI_Comm_free(&comm_);
    // After a timeout the late messages may still be pending: MPI_Finalize could wait for them forever, and
    // the job is ending anyway (the caller was told to abort()).
    if (--g_users == 0 && g_we_init && !broken_) MPI_Finalize();
  }

  const char* name() const override { return "MPI"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce_sum(float* x, size_t n) override {
    check_count("all_reduce_sum", n);
    if (size_ >= 3 && (size_t)(size_ - 1) * n * sizeof(float) > split_min_bytes_)
      return split_all_reduce(x, n);
    exchange("all_reduce_sum", x, n, MPI_FLOAT, scratch_.data());
    // Rank order, left to right: the same bits on every rank. One rank's block at a time (x[i] += block r's
    // [i], a loop the compiler vectorizes), the same order of additions per element as a loop over ranks.
    const float* g = scratch_.data();
    std::memcpy(x, g, n * sizeof(float));
    for (int r = 1; r < size_; ++r) {
      const float* b = g + (size_t)r * n;
      for (size_t i = 0; i < n; ++i) x[i] += b[i];
    }
  }
  void all_reduce_sum_bf16(uint16_t* x, size_t n) override {
    check_count("all_reduce_sum_bf16", n);
    auto* g = reinterpret_cast<uint16_t*>(scratch_.data());  // [size, n] bf16: half the floats' bytes
    exchange("all_reduce_sum_bf16", x, n, MPI_UINT16_T, g);
    for (size_t i = 0; i < n; ++i) {
      float s = bf16_to_fp32(g[i]);
      for (int r = 1; r < size_; ++r) s += bf16_to_fp32(g[(size_t)r * n + i]);
      x[i] = fp32_to_bf16(s);
    }
  }
  void all_gather(const float* in, size_t n, float* out) override {
    check_count("all_gather", n);
    exchange("all_gather", in, n, MPI_FLOAT, out);
  }
  void broadcast(void* data, size_t bytes, int root) override {
    if (root < 0 || root >= size_) fail("MPI broadcast: root {} of {} ranks", root, size_);
    if (bytes > 4 * capacity_)
      fail("MPI broadcast: {} bytes, more than the capacity ({} bytes)", bytes, 4 * capacity_);
    usable("broadcast");
    int nr = 0;
    if (rank_ == root) {
      for (int r = 0; r < size_; ++r)
        if (r != rank_)
          post(MPI_Isend(data, (int)bytes, MPI_BYTE, r, kTag, comm_, &reqs_[nr++]), "broadcast");
    } else {
      post(MPI_Irecv(data, (int)bytes, MPI_BYTE, root, kTag, comm_, &reqs_[nr++]), "broadcast");
    }
    wait("broadcast", bytes, nr);
  }
  void barrier() override {
    float one = 1.0f;
    exchange("barrier", &one, 1, MPI_FLOAT, scratch_.data());
  }
  bool settle(double seconds) override {
    const auto t0 = std::chrono::steady_clock::now();
    while (broken_) {
      if (pending_ == 0) return false;  // broken by an MPI error, not a timeout
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() >= seconds)
        return false;
      int done = 0;
      if (MPI_Testall(pending_, reqs_.data(), &done, MPI_STATUSES_IGNORE) != MPI_SUCCESS) return false;
      if (!done) {
        std::this_thread::yield();
        continue;
      }
      broken_ = false;
      pending_ = 0;
      if (split_.x) {
        // A split all-reduce that timed out in its reduce-scatter: the other ranks wait for this one's summed
        // chunk, so its all-gather runs too (its results are not delivered: the call has thrown). A timeout
        // there leaves its requests pending, waited for on the next turns.
        const Split sp = split_;
        split_ = {};
        try {
          split_gather(sp.x, sp.n);
        } catch (const Error&) {
        }
      }
    }
    return true;
  }
  bool broken() const override { return broken_; }
  [[noreturn]] void abort(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }

 private:
  static constexpr int kTag = 7117;  // messages of one pair arrive in the order sent: one tag serves all

  void check_count(const char* what, size_t n) const {
    if (n > capacity_)
      fail("MPI {}: {} floats, more than the communicator's capacity ({})", what, n, capacity_);
  }
  void usable(const char* what) const {
    if (broken_) fail("MPI {}: the communicator stopped at an earlier timeout (end the job)", what);
  }
  void post(int rc, const char* what) {
    if (rc != MPI_SUCCESS) {
      broken_ = true;
      char msg[MPI_MAX_ERROR_STRING];
      int len = 0;
      MPI_Error_string(rc, msg, &len);
      fail("MPI {} on rank {} of {}: {}", what, rank_, size_, std::string(msg, (size_t)len));
    }
  }
  // Rank r's chunk of a split all-reduce of n: [chunk0(r), chunk0(r + 1)).
  size_t chunk0(int r, size_t n) const { return (size_t)r * n / (size_t)size_; }
  // The reduce-scatter: every rank sends each other rank its part of their chunk and receives every rank's
  // part of its own (into scratch slot r, chunk-sized slots); then its chunk of x = their sum in rank order.
  void split_all_reduce(float* x, size_t n) {
    const char* what = "all_reduce_sum";
    usable(what);
    const size_t slot = (n + (size_t)size_ - 1) / (size_t)size_;
    const size_t m0 = chunk0(rank_, n), m = chunk0(rank_ + 1, n) - m0;
    float* g = scratch_.data();
    int nr = 0;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      const size_t r0 = chunk0(r, n), rn = chunk0(r + 1, n) - r0;
      post(MPI_Irecv(g + (size_t)r * slot, (int)m, MPI_FLOAT, r, kTag, comm_, &reqs_[nr++]), what);
      post(MPI_Isend(x + r0, (int)rn, MPI_FLOAT, r, kTag, comm_, &reqs_[nr++]), what);
    }
    std::memcpy(g + (size_t)rank_ * slot, x + m0, m * sizeof(float));
    split_ = {x, n};  // what settle() resumes if this wait times out
    wait(what, n, nr);
    split_ = {};
    split_gather(x, n);
  }
  // The all-gather of a split all-reduce, once this rank's parts are in scratch: sums its chunk (rank order,
  // one block at a time) into x and exchanges the summed chunks.
  void split_gather(float* x, size_t n) {
    const char* what = "all_reduce_sum";
    const size_t slot = (n + (size_t)size_ - 1) / (size_t)size_;
    const size_t m0 = chunk0(rank_, n), m = chunk0(rank_ + 1, n) - m0;
    const float* g = scratch_.data();
    float* y = x + m0;
    std::memcpy(y, g, m * sizeof(float));
    for (int r = 1; r < size_; ++r) {
      const float* b = g + (size_t)r * slot;
      for (size_t i = 0; i < m; ++i) y[i] += b[i];
    }
    int nr = 0;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      const size_t r0 = chunk0(r, n), rn = chunk0(r + 1, n) - r0;
      post(MPI_Irecv(x + r0, (int)rn, MPI_FLOAT, r, kTag, comm_, &reqs_[nr++]), what);
      post(MPI_Isend(y, (int)m, MPI_FLOAT, r, kTag, comm_, &reqs_[nr++]), what);
    }
    wait(what, n, nr);
  }
  // out[r * n ..] = rank r's in[0, n) for every r (elements of type T, MPI type t): every pair of ranks
  // exchanges its block directly.
  template <class T>
  void exchange(const char* what, const T* in, size_t n, MPI_Datatype t, T* out) {
    usable(what);
    int nr = 0;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      post(MPI_Irecv(out + (size_t)r * n, (int)n, t, r, kTag, comm_, &reqs_[nr++]), what);
      post(MPI_Isend(in, (int)n, t, r, kTag, comm_, &reqs_[nr++]), what);
    }
    if (out + (size_t)rank_ * n != in) std::memcpy(out + (size_t)rank_ * n, in, n * sizeof(T));
    wait(what, n, nr);
  }
  // Polls the nr posted requests until they complete or timeout_s passes (then throws; broken from then on).
  void wait(const char* what, size_t n, int nr) {
    if (nr == 0) return;
    const auto t0 = std::chrono::steady_clock::now();
    for (long spin = 0;; ++spin) {
      int done = 0;
      post(MPI_Testall(nr, reqs_.data(), &done, MPI_STATUSES_IGNORE), what);
      if (done) return;
      if ((spin & 1023) == 1023) {
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (s > timeout_s_) {
          broken_ = true;
          pending_ = nr;
          fail(
              "MPI {} of {} values on rank {} of {}: no answer within {} s (another rank stopped or died; "
              "its output says why)",
              what, n, rank_, size_, timeout_s_);
        }
        if (s > 1e-3) std::this_thread::yield();  // a long wait: leave the core to the others
      }
    }
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  double timeout_s_;
  bool broken_ = false;
  int pending_ = 0;  // requests of the collective that timed out
  struct Split {
    float* x = nullptr;
    size_t n = 0;
  } split_;  // a split all-reduce whose reduce-scatter timed out (settle() resumes it)
  size_t split_min_bytes_;
  std::vector<float> scratch_;     // [size, capacity] the gathered shards of an all-reduce
  std::vector<MPI_Request> reqs_;  // [2 size] one collective's messages
};

}  // namespace

bool have_mpi() {
  return true;
}

std::unique_ptr<Communicator> make_mpi_communicator(const DistOptions& options) {
  return std::make_unique<MpiCommunicator>(options);
}

}  // namespace ultra::dist
