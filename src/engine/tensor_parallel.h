// Tensor parallelism's steps (model/shard.h): rank 0 runs the Context API; the CPU backend of its context
// sends every step's rows to the other ranks before running its own forward, and the other ranks follow
// (run_tp_follower(): a backend of the same parameters on their shard, the same steps). Messages, all
// broadcasts from rank 0:
//   header  TpHeader (fixed size): the command and its numbers
//   rows    after a step's header: token [n], pos [n], seq [n], out_row [n_out] (int32)
#pragma once

#include <cstdint>
#include <functional>

#include "engine/backend.h"

namespace ultra {

namespace dist {
class Communicator;
}

enum class TpCmd : int32_t { create = 1, step = 2, destroy = 3, end = 4, copy_kv = 5 };

struct TpHeader {
  TpCmd cmd = TpCmd::end;
  int32_t pad = 0;
  // create: n_ctx, n_slots, n_batch, n_outputs, n_threads, kv_type, n_sample, mem_limit; step: n, n_out;
  // copy_kv: from, to, n (Context::copy_seq: every rank copies its shard of the KV cache).
  int64_t a[8] = {};
};

// int32 values of the rows message of a step of n rows and n_out outputs (the most: wire buffer size).
inline int64_t tp_rows_words(int n, int n_out) {
  return 3 * (int64_t)n + n_out;
}

// Rank 0's messages. tp_send_step packs the rows into wire [tp_rows_words(n_batch, n_outputs)].
void tp_send_create(dist::Communicator& comm, const ContextParams& p, int n_sample);
void tp_send_step(dist::Communicator& comm, const StepRows& rows, int32_t* wire);
void tp_send_copy_kv(dist::Communicator& comm, int from, int to, int n);
// destroy and end; never throws (called from destructors): a failed send is for the next collective to
// report, or the job is ending anyway.
void tp_send(dist::Communicator& comm, TpCmd cmd) noexcept;

// run_tp_follower() on m (the split model of this rank, not 0), calling after(cmd) once each command has run
// (tests: the allocations of the steps).
void tp_follow(const ModelData& m, const std::function<void(TpCmd)>& after = {});

}  // namespace ultra
