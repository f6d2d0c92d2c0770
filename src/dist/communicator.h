// The collectives that tensor parallelism needs (Megatron-style: an all-reduce after each row-split
// projection, an all-gather of vocabulary shards, the step's batch broadcast from rank 0), behind one seam
// with one implementation per transport: MPI here (ranks started by `mpirun`, across hosts by its hostfile);
// NCCL (nccl_communicator.h: on device buffers, its unique id broadcast over this one, so that mpirun
// launches both).
//
// Every collective works on the caller's buffers and on scratch allocated when the communicator is made
// (capacity: the most floats one collective carries), so that a step allocates nothing. Every collective
// waits at most DistOptions::timeout_s: a rank that died or stopped answering ends the wait with an
// ultra::Error naming the collective, instead of a hang; the communicator is then broken() (unusable), and
// the caller ends the job (abort()). Errors that are not the transport's (a count over the capacity, a bad
// root: refused before anything is sent) leave it usable.
//
// all_reduce_sum gives every rank the same bits, and the same bits whatever the number of ranks' transport
// algorithm: the shards are gathered and summed in rank order (x_0 + x_1 + ... + x_{n-1}, left to right),
// not reduced in the order the transport's algorithm picks. The bf16 all-reduce sums in f32 in the same
// order and rounds once (to nearest even).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace ultra::dist {

struct DistOptions {
  size_t capacity = size_t{1} << 20;  // most floats in one collective (per rank)
  double timeout_s = 60;              // longest wait of one collective
  // An all-reduce of 3 ranks or more whose direct exchange would send more than this many bytes per rank
  // ((size - 1) * 4 n) runs as a reduce-scatter and an all-gather instead: 2 (size - 1) / size * 4 n bytes
  // in two message latencies instead of one (MPI transport; the same bits either way).
  size_t split_min_bytes = 64 << 10;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual const char* name() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  size_t capacity() const { return capacity_; }

  // x[0, n) = the sum over ranks of every rank's x[0, n), in rank order; n <= capacity().
  virtual void all_reduce_sum(float* x, size_t n) = 0;
  // The same over bf16 values (their bit patterns): x[i] = bf16(f32 sum in rank order); n <= capacity().
  virtual void all_reduce_sum_bf16(uint16_t* x, size_t n) = 0;
  // out[r * n + i] = rank r's in[i], for every rank r; n <= capacity(). in may not alias out.
  virtual void all_gather(const float* in, size_t n, float* out) = 0;
  // bytes of data from rank root to every rank (bytes <= 4 * capacity()).
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  virtual void barrier() = 0;
  // After a timeout: waits up to seconds for the collective that timed out to complete (the late rank
  // arrived after all); true when it did, and the communicator is usable again (the timed-out collective's
  // results are not delivered: the call has already thrown).
  virtual bool settle(double seconds) = 0;
  // Whether a collective failed (an error of the transport, or a timeout not settled since): the ranks may
  // be at different collectives, and every collective throws until settle() returns true.
  virtual bool broken() const = 0;
  // Ends every rank's process (after an error: a rank that cannot go on must not leave the others
  // waiting). Does not return.
  [[noreturn]] virtual void abort(int code) = 0;

 protected:
  size_t capacity_ = 0;
};

// Whether this build has the MPI transport (CMake found MPI: ULTRA_MPI).
bool have_mpi();
// The MPI transport over MPI_COMM_WORLD (initialising MPI, with MPI_THREAD_SERIALIZED, unless the program
// did: one thread at a time may call, e.g. a server's step thread after the main thread made the context);
// MPI is finalised when the last communicator is destroyed. Throws ultra::Error without MPI in the build.
std::unique_ptr<Communicator> make_mpi_communicator(const DistOptions& options = {});

}  // namespace ultra::dist
