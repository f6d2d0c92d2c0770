// The NCCL transport of communicator.h, for ranks that each drive one GPU: every pointer given to a
// collective is device memory of the communicator's GPU (cudaMalloc), and the collectives run on a CUDA
// stream. Rank 0 makes NCCL's unique id and broadcasts it over a bootstrap communicator (the MPI one), so one
// launcher (`mpirun -np N`, one rank per GPU) starts both.
//
// The seam's contract holds: all_reduce_sum gives every rank the same bits, the sum in rank order. With 2
// ranks that is ncclAllReduce itself (a + b == b + a in IEEE arithmetic, and NCCL adds each pair once); with
// more, an ncclAllGather into device scratch [size, capacity] and a kernel summing it in rank order (NCCL's
// ring or tree order would depend on the topology). bf16 is summed in f32 and rounded once, as MPI does.
//
// Timeouts: the communicator is NCCL's non-blocking kind (ncclConfig_t::blocking = 0), so that neither its
// creation nor an enqueue can block without bound; every wait polls cudaStreamQuery and
// ncclCommGetAsyncError until the stream is done, an error is reported, or DistOptions::timeout_s passes
// (at least 120 s for the communicator's creation and finalization, which take NCCL seconds) (then
// ultra::Error naming the collective, and the communicator is broken). settle() keeps polling (the late
// rank arrived after all); abort() calls ncclCommAbort (which unblocks the stream's kernels) and then the
// bootstrap's abort (MPI_Abort), ending every rank's process.
//
// Every collective makes the communicator's device current on the calling thread.
// Synchronous by default: each collective returns when its results are in place. set_async(true) makes
// them return once enqueued on the stream (set_stream: a backend's own stream, in a CUDA graph's capture
// too), and wait() bounds the wait for everything enqueued so far.
#pragma once

#include <memory>

#include "dist/communicator.h"

namespace ultra::dist {

class NcclCommunicator : public Communicator {
 public:
  // The CUDA stream (cudaStream_t) the collectives are enqueued on; nullptr: the communicator's own.
  virtual void set_stream(void* stream) = 0;
  virtual void set_async(bool async) = 0;
  // Waits for the stream's work (the collectives enqueued so far), at most the timeout; throws as a
  // collective does.
  virtual void wait() = 0;
  // The CUDA device of this rank.
  virtual int device() const = 0;
};

// Built into the library ultra_nccl when CMake finds the CUDA toolkit, its nccl.h and libnccl, and MPI
// (ULTRA_NCCL); a program linking it has ULTRA_HAVE_NCCL defined.
// The NCCL transport over the ranks of bootstrap (rank r of bootstrap is rank r here), on CUDA device
// `device`, or with device < 0 the local rank (OMPI_COMM_WORLD_LOCAL_RANK, else bootstrap's rank) modulo the
// number of devices. Allocates its device scratch here. Throws ultra::Error without a device (on any rank),
// or when a rank does not join within options.timeout_s. Every rank must call it (it is a collective of
// bootstrap).
std::unique_ptr<NcclCommunicator> make_nccl_communicator(Communicator& bootstrap,
                                                         const DistOptions& options = {}, int device = -1);

}  // namespace ultra::dist
