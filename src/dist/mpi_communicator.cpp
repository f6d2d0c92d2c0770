// The MPI transport of communicator.h. Collectives are written over non-blocking point-to-point messages
// (MPI_Isend / MPI_Irecv into the caller's buffers and the scratch made at construction), polled with
// MPI_Testall until they complete or the timeout passes: the wait can end (a collective of the MPI library
// blocks without a bound), and nothing is allocated per call (MPI's own requests come from its free lists).
// With the few ranks of tensor parallelism, every rank exchanges its block with every other rank directly:
// one message latency per collective, (size - 1) * n floats sent and received per rank.
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
  explicit MpiCommunicator(const DistOptions& o) : timeout_s_(o.timeout_s) {
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
    if (!broken_ || pending_ == 0) return !broken_;
    const auto t0 = std::chrono::steady_clock::now();
    while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < seconds) {
      int done = 0;
      if (MPI_Testall(pending_, reqs_.data(), &done, MPI_STATUSES_IGNORE) != MPI_SUCCESS) return false;
      if (done) {
        broken_ = false;
        pending_ = 0;
        return true;
      }
      std::this_thread::yield();
    }
    return false;
  }
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
  int pending_ = 0;                // requests of the collective that timed out
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
