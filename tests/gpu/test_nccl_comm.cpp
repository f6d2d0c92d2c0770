// The NCCL transport of src/dist (nccl_communicator.h), one GPU per rank, in either of two launches:
//   build/test_nccl_comm [--ranks N] [--hang]         forks N ranks (default 2) that bootstrap over shared
//                                                     memory: no MPI needed (a bare GPU machine)
//   mpirun -np N build/test_nccl_comm [--hang]        the MPI bootstrap (ctest test_nccl_comm_np2), and every
//                                                     result also compared with the MPI transport's
// N = 2 runs ncclAllReduce itself, N >= 3 the gather and the rank-order kernel.
// Every collective on device buffers, its result copied back and compared bit for bit with what each rank
// computes itself from every rank's data (a known function of the rank: the sum in rank order, the bf16 sum
// in f32 rounded once, the gathered blocks, the root's bytes; what test_dist checks the MPI transport
// against): all_reduce_sum f32 and bf16, all_gather, broadcast from every root, for a decode step's sizes
// (4096, 8192 floats: one row of a 4096- or 8192-wide model) up to the capacity (1M floats); the
// asynchronous mode (10 all-reduces enqueued on a stream of the caller's, then wait()); the capacity refused;
// no host allocation on the calling thread over a decode step's collectives after a warm-up; a late rank: the
// others' all-reduce ends with an error after the timeout, settle() completes it once the
// late rank arrives, and the communicator works again. Then the median latency of one all-reduce of 4096,
// 8192 and 512K floats (informational; with MPI, the MPI transport's on host memory beside it).
// --hang: rank 1 stops answering; rank 0's all-reduce must end with the timeout's error within seconds,
// then it prints NCCL-HANG-CHECK PASSED and aborts the job.
//
// Exit 0 when every check passed on every rank, 1 otherwise, 77 (skipped) when a rank has no CUDA device.
#include <cuda_runtime_api.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "dist/communicator.h"
#include "dist/nccl_communicator.h"
#include "rank_checks.h"
#include "ultra/error.h"

using namespace ultra;

namespace {

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string(what) + ": " + cudaGetErrorString(e));
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// ---- the bootstrap of the forked ranks: shared memory made before fork() ----

constexpr int kMaxRanks = 16;
constexpr size_t kSlotBytes = 4096;  // the most one bootstrap collective carries per rank

struct Shared {
  std::atomic<int> arrived{0}, generation{0}, aborted{0};
  pid_t pid[kMaxRanks];
  alignas(64) unsigned char slot[kMaxRanks][kSlotBytes];
};

// communicator.h over Shared: every collective is copy in, barrier, read, barrier (a sense-counting barrier
// on the shared atomics, bounded by a timeout). Enough for the NCCL bootstrap (one float, the unique id).
class ForkBootstrap final : public dist::Communicator {
 public:
  ForkBootstrap(Shared* sh, int rank, int size) : sh_(sh), rank_(rank), size_(size) {
    capacity_ = kSlotBytes / 4;
  }
  const char* name() const override { return "fork"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_reduce_sum(float* x, size_t n) override {
    exchange(x, n * 4);
    for (size_t i = 0; i < n; ++i) {
      float s = at<float>(0)[i];
      for (int r = 1; r < size_; ++r) s += at<float>(r)[i];
      x[i] = s;
    }
    barrier();
  }
  void all_reduce_sum_bf16(uint16_t*, size_t) override { throw Error("fork bootstrap: no bf16"); }
  void all_gather(const float* in, size_t n, float* out) override {
    exchange(in, n * 4);
    for (int r = 0; r < size_; ++r) std::memcpy(out + (size_t)r * n, at<float>(r), n * 4);
    barrier();
  }
  void broadcast(void* data, size_t bytes, int root) override {
    if (rank_ == root) check_bytes(bytes), std::memcpy(sh_->slot[root], data, bytes);
    barrier();
    if (rank_ != root) std::memcpy(data, sh_->slot[root], bytes);
    barrier();
  }
  void barrier() override {
    const int gen = sh_->generation.load();
    if (sh_->arrived.fetch_add(1) + 1 == size_) {
      sh_->arrived.store(0);
      sh_->generation.fetch_add(1);
      return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    while (sh_->generation.load() == gen) {
      if (seconds_since(t0) > 60) throw Error("fork bootstrap: a rank did not reach the barrier in 60 s");
      std::this_thread::yield();
    }
  }
  bool settle(double) override { return false; }
  bool broken() const override { return false; }
  // Kills the other ranks (as mpirun's abort does) and exits with code.
  [[noreturn]] void abort(int code) override {
    std::fflush(stdout);
    sh_->aborted.store(1);
    for (int r = 0; r < size_; ++r)
      if (r != rank_) ::kill(sh_->pid[r], SIGKILL);
    std::_Exit(code);
  }

 private:
  template <class T>
  const T* at(int r) const {
    return reinterpret_cast<const T*>(sh_->slot[r]);
  }
  void check_bytes(size_t bytes) const {
    if (bytes > kSlotBytes) throw Error("fork bootstrap: " + std::to_string(bytes) + " bytes is too many");
  }
  void exchange(const void* in, size_t bytes) {
    check_bytes(bytes);
    std::memcpy(sh_->slot[rank_], in, bytes);
    barrier();
  }
  Shared* sh_;
  int rank_, size_;
};

// ---- the checks ----

template <class T>
struct DeviceBuffer {
  T* p = nullptr;
  explicit DeviceBuffer(size_t n) {
    cuda_ok(cudaMalloc(reinterpret_cast<void**>(&p), std::max<size_t>(n, 1) * sizeof(T)), "cudaMalloc");
  }
  ~DeviceBuffer() { cudaFree(p); }
  void put(const T* h, size_t n) { cuda_ok(cudaMemcpy(p, h, n * sizeof(T), cudaMemcpyHostToDevice), "put"); }
  void get(T* h, size_t n) const { cuda_ok(cudaMemcpy(h, p, n * sizeof(T), cudaMemcpyDeviceToHost), "get"); }
};

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b, size_t n) {
  return std::memcmp(a.data(), b.data(), n * sizeof(T)) == 0;
}

// mpi: the MPI transport when launched by mpirun (its results must be the same bits), else null.
void collectives(dist::Communicator* mpi, dist::NcclCommunicator& nccl, size_t cap) {
  const int rank = nccl.rank(), size = nccl.size();
  std::vector<float> h(cap), ref(cap), got((size_t)size * cap), ref_all((size_t)size * cap);
  std::vector<uint16_t> hb(cap), refb(cap), gotb(cap);
  DeviceBuffer<float> x(cap), all((size_t)size * cap);
  DeviceBuffer<uint16_t> xb(cap);
  for (size_t n : {size_t{1}, size_t{7}, size_t{4096}, size_t{8192}, size_t{8192 * 16}, cap}) {
    const std::string ns = std::to_string(n);
    for (size_t i = 0; i < n; ++i) h[i] = value(rank, i);
    // f32 all-reduce: the sum in rank order
    for (size_t i = 0; i < n; ++i) {
      float s = value(0, i);
      for (int r = 1; r < size; ++r) s += value(r, i);
      ref[i] = s;
    }
    x.put(h.data(), n);
    nccl.all_reduce_sum(x.p, n);
    x.get(got.data(), n);
    check(same_bits(got, ref, n), "all_reduce_sum of " + ns + " is the sum in rank order, bit for bit");
    if (mpi) {
      std::copy(h.begin(), h.begin() + (long)n, ref.begin());
      mpi->all_reduce_sum(ref.data(), n);
      check(same_bits(got, ref, n), "all_reduce_sum of " + ns + ": NCCL's bits are MPI's");
    }
    // bf16 all-reduce: the f32 sum in rank order, rounded once
    for (size_t i = 0; i < n; ++i) {
      hb[i] = fp32_to_bf16(h[i]);
      float s = bf16_to_fp32(fp32_to_bf16(value(0, i)));
      for (int r = 1; r < size; ++r) s += bf16_to_fp32(fp32_to_bf16(value(r, i)));
      refb[i] = fp32_to_bf16(s);
    }
    xb.put(hb.data(), n);
    nccl.all_reduce_sum_bf16(xb.p, n);
    xb.get(gotb.data(), n);
    check(same_bits(gotb, refb, n),
          "all_reduce_sum_bf16 of " + ns + " is the f32 sum in rank order, rounded");
    if (mpi) {
      refb = hb;
      mpi->all_reduce_sum_bf16(refb.data(), n);
      check(same_bits(gotb, refb, n), "all_reduce_sum_bf16 of " + ns + ": NCCL's bits are MPI's");
    }
    // all-gather
    for (int r = 0; r < size; ++r)
      for (size_t i = 0; i < n; ++i) ref_all[(size_t)r * n + i] = value(r, i);
    x.put(h.data(), n);
    nccl.all_gather(x.p, n, all.p);
    all.get(got.data(), (size_t)size * n);
    check(same_bits(got, ref_all, (size_t)size * n), "all_gather of " + ns);
    if (mpi) {
      mpi->all_gather(h.data(), n, ref_all.data());
      check(same_bits(got, ref_all, (size_t)size * n), "all_gather of " + ns + ": NCCL's equals MPI's");
    }
  }
  // broadcast from every root, a short message and the capacity's bytes
  for (int root = 0; root < size; ++root) {
    for (size_t bytes : {size_t{100}, 4 * cap}) {
      const size_t nf = bytes / 4;
      for (size_t i = 0; i < nf; ++i) h[i] = rank == root ? value(root, i) : -1.0f;
      x.put(h.data(), nf);
      nccl.broadcast(x.p, bytes, root);
      x.get(got.data(), nf);
      bool ok = true;
      for (size_t i = 0; i < nf && ok; ++i) ok = got[i] == value(root, i);
      check(ok, "broadcast of " + std::to_string(bytes) + " bytes from rank " + std::to_string(root));
    }
  }
  nccl.barrier();
  check(true, "barrier");

  // Asynchronous: 10 all-reduces enqueued on the caller's stream, then wait(). After the first every rank
  // holds the same x, and each next one is x + x + ... (size terms, left to right).
  {
    const size_t n = 8192;
    cudaStream_t s = nullptr;
    cuda_ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    for (size_t i = 0; i < n; ++i) {
      h[i] = value(rank, i) * 0.1f;
      float a = value(0, i) * 0.1f;
      for (int r = 1; r < size; ++r) a += value(r, i) * 0.1f;
      for (int k = 1; k < 10; ++k) {
        float b = a;
        for (int r = 1; r < size; ++r) b += a;
        a = b;
      }
      ref[i] = a;
    }
    x.put(h.data(), n);
    nccl.set_stream(s);
    nccl.set_async(true);
    for (int k = 0; k < 10; ++k) nccl.all_reduce_sum(x.p, n);
    nccl.wait();
    nccl.set_async(false);
    nccl.set_stream(nullptr);
    x.get(got.data(), n);
    check(same_bits(got, ref, n), "10 asynchronous all-reduces on the caller's stream");
    cudaStreamDestroy(s);
  }

  // Past the capacity: an error, nothing sent.
  try {
    nccl.all_reduce_sum(x.p, cap + 1);
    check(false, "all_reduce_sum past the capacity is refused");
  } catch (const Error& e) {
    check(std::string(e.what()).find("capacity") != std::string::npos, "capacity error names the capacity");
  }
}

// No host allocation on the calling thread over a decode step's collectives after a warm-up of the same
// pattern, synchronous and asynchronous (three windows of 50 rounds: at least one without any, as test_dist
// allows Open MPI's free lists).
void no_allocation(dist::NcclCommunicator& nccl) {
#if ULTRA_COUNT_ALLOCS
  DeviceBuffer<float> x(8192), all((size_t)nccl.size() * 8192);
  auto decode_like = [&](int rounds) {
    for (int it = 0; it < rounds; ++it) {
      nccl.all_reduce_sum(x.p, 8192);
      nccl.all_gather(x.p, 1000, all.p);
      nccl.broadcast(x.p, 256, 0);
      nccl.set_async(true);
      for (int k = 0; k < 4; ++k) nccl.all_reduce_sum(x.p, 4096);
      nccl.wait();
      nccl.set_async(false);
    }
  };
  decode_like(50);  // warm-up
  check_no_allocation("a decode step's collectives", [&] { decode_like(50); });
#endif
}

// rank 1 joins an all-reduce 1.5 s late; the others' timeout is 0.5 s.
void late_rank(dist::Communicator& boot) {
  dist::DistOptions o;
  o.capacity = 1024;
  o.timeout_s = 0.5;
  auto late = dist::make_nccl_communicator(boot, o);
  const int size = late->size();
  DeviceBuffer<float> x(64);
  std::vector<float> h(64), got(64), ref(64);
  for (size_t i = 0; i < 64; ++i) {
    h[i] = value(late->rank(), i);
    ref[i] = value(0, i);
    for (int r = 1; r < size; ++r) ref[i] += value(r, i);
  }
  x.put(h.data(), 64);
  boot.barrier();  // every rank's creation done (it may take one rank longer than the 0.5 s timeout)
  late->barrier();
  if (late->rank() == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    late->all_reduce_sum(x.p, 64);
    check(true, "the late rank's all-reduce completes");
  } else {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      late->all_reduce_sum(x.p, 64);
      check(false, "an all-reduce waiting for a late rank times out");
    } catch (const Error& e) {
      const double s = seconds_since(t0);
      check(s >= 0.45 && s < 1.4,
            "the timeout ends the wait after ~0.5 s (took " + std::to_string(s) + " s)");
      check(std::string(e.what()).find("no answer within") != std::string::npos,
            std::string("the timeout's message: ") + e.what());
      try {
        late->all_reduce_sum(x.p, 64);
        check(false, "a broken communicator refuses the next collective");
      } catch (const Error& e2) {
        check(std::string(e2.what()).find("earlier") != std::string::npos,
              std::string("the broken communicator's message: ") + e2.what());
      }
      check(late->settle(10), "settle() completes the all-reduce once the late rank arrives");
    }
  }
  x.get(got.data(), 64);
  check(same_bits(got, ref, 64), "the late all-reduce's result (after settle) is the sum");
  late->barrier();
  late->all_reduce_sum(x.p, 64);
  check(true, "the communicator works again after settle()");
}

template <class F>
double median_seconds(F&& f) {
  std::vector<double> t;
  for (int i = 0; i < 220; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    if (i >= 20) t.push_back(seconds_since(t0));
  }
  std::nth_element(t.begin(), t.begin() + (long)t.size() / 2, t.end());
  return t[t.size() / 2];
}

// The median seconds of one all-reduce of n floats: NCCL on device memory (MPI on host memory beside it).
void latency(dist::Communicator* mpi, dist::NcclCommunicator& nccl, size_t n) {
  std::vector<float> h(n, 1.0f);
  DeviceBuffer<float> x(n);
  x.put(h.data(), n);
  nccl.barrier();
  const double c = median_seconds([&] { nccl.all_reduce_sum(x.p, n); });
  double m = 0;
  if (mpi) {
    mpi->barrier();
    m = median_seconds([&] { mpi->all_reduce_sum(h.data(), n); });
  }
  if (nccl.rank() == 0)
    std::printf("all_reduce_sum of %zu floats (%zu bytes), median of 200: NCCL %.1f us%s\n", n, n * 4,
                c * 1e6, mpi ? (", MPI " + std::to_string(m * 1e6) + " us").c_str() : "");
}

[[noreturn]] void hang_check(dist::Communicator& boot) {
  dist::DistOptions o;
  o.capacity = 8192;
  o.timeout_s = 2;
  auto nccl = dist::make_nccl_communicator(boot, o);
  DeviceBuffer<float> x(8192);
  boot.barrier();  // every rank's creation done
  nccl->barrier();
  if (boot.rank() != 0) {
    std::this_thread::sleep_for(std::chrono::seconds(60));  // stops answering
    std::_Exit(1);
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::string e;
  try {
    for (int i = 0; i < 10; ++i) nccl->all_reduce_sum(x.p, 8192);
  } catch (const Error& err) {
    e = err.what();
  }
  const double s = seconds_since(t0);
  std::printf("rank 0: after %.1f s: %s\n", s, e.c_str());
  const bool ok = !e.empty() && s < 10 && e.find("no answer within 2 s") != std::string::npos;
  if (ok) std::printf("NCCL-HANG-CHECK PASSED\n");
  std::fflush(stdout);
  nccl->abort(ok ? 0 : 1);  // ncclCommAbort, then the bootstrap's abort: rank 1 is still asleep
  std::_Exit(1);            // not reached
}

// One rank's run over the bootstrap (mpi: the same communicator when it is MPI's). 0, 1 or 77.
int run_rank(dist::Communicator& boot, dist::Communicator* mpi, bool hang) {
  g_rank = boot.rank();
  int n_dev = 0;
  float none = cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0 ? 1.0f : 0.0f;
  boot.all_reduce_sum(&none, 1);
  if (none > 0) {
    if (g_rank == 0) std::printf("test_nccl_comm: skipped (a rank has no CUDA device)\n");
    return 77;
  }
  try {
    if (hang) hang_check(boot);
    dist::DistOptions opt;
    opt.capacity = 1 << 20;
    opt.timeout_s = 30;
    auto nccl = dist::make_nccl_communicator(boot, opt);
    if (g_rank == 0)
      std::printf("test_nccl_comm: %d ranks (%s bootstrap), rank 0 on device %d of %d\n", boot.size(),
                  boot.name(), nccl->device(), n_dev);
    collectives(mpi, *nccl, opt.capacity);
    no_allocation(*nccl);
    for (size_t n : {size_t{4096}, size_t{8192}, size_t{8192 * 64}}) latency(mpi, *nccl, n);
    nccl.reset();
    late_rank(boot);
  } catch (const std::exception& e) {
    check(false, std::string("exception: ") + e.what());
  }
  std::printf("rank %d: %d passed, %d failed\n", g_rank, g_pass, g_fail);
  return g_fail ? 1 : 0;
}

// Forks n ranks over a ForkBootstrap (before any CUDA call in this process); the job's exit code: 0 when
// every rank passed, 77 when they skipped, rank 0's code after an abort, else 1.
int fork_ranks(int n, bool hang) {
  if (n < 1 || n > kMaxRanks) {
    std::fprintf(stderr, "--ranks must be 1 .. %d\n", kMaxRanks);
    return 2;
  }
  void* mem = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return 1;
  Shared* sh = new (mem) Shared;
  for (int r = 0; r < n; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      sh->pid[r] = getpid();
      ForkBootstrap boot(sh, r, n);
      boot.barrier();  // every pid is in place before anyone may abort
      const int code = run_rank(boot, nullptr, hang);
      std::fflush(stdout);
      std::_Exit(code);
    }
    sh->pid[r] = pid;
  }
  int result = 0, rank0 = -1;
  for (int k = 0; k < n; ++k) {
    int st = 0;
    const pid_t pid = wait(&st);
    const int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (pid == sh->pid[0]) rank0 = code;
    if (code != 0 && code != 77 && !sh->aborted.load()) {  // a rank failed or died: end the others
      for (int r = 0; r < n; ++r) ::kill(sh->pid[r], SIGKILL);
      result = 1;
    }
    if (code == 77 && result == 0) result = 77;
  }
  if (sh->aborted.load()) return rank0;
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  bool hang = false;
  int n = 2;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--hang") {
      hang = true;
    } else if (a == "--ranks" && i + 1 < argc) {
      n = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: test_nccl_comm [--ranks N] [--hang]   (or under mpirun -np N)\n");
      return 2;
    }
  }
  if (!std::getenv("OMPI_COMM_WORLD_SIZE") && !std::getenv("PMI_SIZE")) return fork_ranks(n, hang);
  dist::DistOptions opt;
  opt.capacity = 1 << 20;
  opt.timeout_s = 30;
  auto mpi = dist::make_mpi_communicator(opt);
  return run_rank(*mpi, mpi.get(), hang);
}
