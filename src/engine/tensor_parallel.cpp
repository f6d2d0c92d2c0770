// Rank 0's step messages and the other ranks' loop (engine/tensor_parallel.h).
#include "engine/tensor_parallel.h"

#include <chrono>
#include <cstring>

#include "core/error.h"
#include "dist/communicator.h"
#include "engine/access.h"
#include "engine/model_impl.h"

namespace ultra {

void tp_send_create(dist::Communicator& comm, const ContextParams& p, int n_sample) {
  TpHeader h;
  h.cmd = TpCmd::create;
  const int64_t a[8] = {p.n_ctx,     p.n_slots,          p.n_batch, p.n_outputs,
                        p.n_threads, (int64_t)p.kv_type, n_sample,  (int64_t)p.mem_limit};
  std::memcpy(h.a, a, sizeof a);
  comm.broadcast(&h, sizeof h, 0);
}

void tp_send_step(dist::Communicator& comm, const StepRows& rows, int32_t* wire) {
  TpHeader h;
  h.cmd = TpCmd::step;
  h.a[0] = rows.n;
  h.a[1] = rows.n_out;
  comm.broadcast(&h, sizeof h, 0);
  const size_t n = (size_t)rows.n;
  std::memcpy(wire, rows.token, n * 4);
  std::memcpy(wire + n, rows.pos, n * 4);
  std::memcpy(wire + 2 * n, rows.seq, n * 4);
  std::memcpy(wire + 3 * n, rows.out_row, (size_t)rows.n_out * 4);
  comm.broadcast(wire, (size_t)tp_rows_words(rows.n, rows.n_out) * 4, 0);
}

void tp_send_copy_kv(dist::Communicator& comm, int from, int to, int n) {
  TpHeader h;
  h.cmd = TpCmd::copy_kv;
  h.a[0] = from;
  h.a[1] = to;
  h.a[2] = n;
  comm.broadcast(&h, sizeof h, 0);
}

void tp_send(dist::Communicator& comm, TpCmd cmd) noexcept {
  TpHeader h;
  h.cmd = cmd;
  try {
    comm.broadcast(&h, sizeof h, 0);
  } catch (const std::exception&) {
  }
}

namespace {

// The next header from rank 0, however long rank 0 is idle (a server between requests): a wait that times
// out is settled (the message lands in h), waiting on for as long as it takes; a rank that died ends the job
// through mpirun. An error that is not a timeout (settle() then fails at once) is thrown.
TpHeader next_header(dist::Communicator& comm) {
  TpHeader h;
  try {
    comm.broadcast(&h, sizeof h, 0);
  } catch (const Error&) {
    for (;;) {
      const auto t0 = std::chrono::steady_clock::now();
      if (comm.settle(60)) break;
      if (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(1)) throw;
    }
  }
  return h;
}

}  // namespace

void run_tp_follower(const Model& model) {
  tp_follow(*detail::impl(model).data);
}

void tp_follow(const ModelData& m, const std::function<void(TpCmd)>& after) {
  if (!m.comm) fail("run_tp_follower: the model is not split (load it with LoadParams::tp > 1)");
  if (m.tp_rank == 0) fail("run_tp_follower: rank 0 runs the Context, not the follower loop");
  dist::Communicator& comm = *m.comm;
  std::unique_ptr<Backend> be;
  std::vector<int32_t> wire;
  StepStats stats;
  for (;;) {
    const TpHeader h = next_header(comm);
    switch (h.cmd) {
      case TpCmd::create: {
        ContextParams p;
        p.n_ctx = (int)h.a[0];
        p.n_slots = (int)h.a[1];
        p.n_batch = (int)h.a[2];
        p.n_outputs = (int)h.a[3];
        p.n_threads = (int)h.a[4];
        p.kv_type = (KvType)h.a[5];
        p.mem_limit = (size_t)h.a[7];
        be.reset();
        check_cpu_memory(m, p, 0);  // this rank's shard of the KV cache and its scratch
        be = make_cpu_backend(m, p, (int)h.a[6], /*tp_follower=*/true);
        wire.assign((size_t)tp_rows_words(p.n_batch, p.n_outputs), 0);
        break;
      }
      case TpCmd::step: {
        if (!be) fail("tensor parallelism: rank {} got a step before its context", m.tp_rank);
        const int n = (int)h.a[0], n_out = (int)h.a[1];
        if (n < 0 || n_out < 0 || (size_t)tp_rows_words(n, n_out) > wire.size())
          fail("tensor parallelism: rank {} got a step of {} rows, {} outputs", m.tp_rank, n, n_out);
        comm.broadcast(wire.data(), (size_t)tp_rows_words(n, n_out) * 4, 0);
        StepRows rows;
        rows.n = n;
        rows.token = wire.data();
        rows.pos = wire.data() + n;
        rows.seq = wire.data() + 2 * (size_t)n;
        rows.n_out = n_out;
        rows.out_row = wire.data() + 3 * (size_t)n;
        be->step(rows, nullptr, 0, nullptr, nullptr, stats);
        break;
      }
      case TpCmd::copy_kv:
        if (!be) fail("tensor parallelism: rank {} got a KV copy before its context", m.tp_rank);
        be->copy_kv((int)h.a[0], (int)h.a[1], (int)h.a[2]);  // checked by rank 0's Context::copy_seq
        break;
      case TpCmd::destroy:
        be.reset();
        break;
      case TpCmd::end:
        if (after) after(h.cmd);
        return;
      default:
        fail("tensor parallelism: rank {} got an unknown command {}", m.tp_rank, (int)h.cmd);
    }
    if (after) after(h.cmd);
  }
}

}  // namespace ultra
