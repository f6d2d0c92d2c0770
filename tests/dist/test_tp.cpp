// Tensor parallelism (model/shard.h) under `mpirun -np 2` and `-np 3` (ctest): every rank loads the model
// split (LoadParams::tp = the job's size); rank 0 runs contexts on it and on the same model loaded whole
// (no split) in the same process, the other ranks run_tp_follower(). Checked on rank 0, per model (HF
// fixtures in F32: GQA, one KV head replicated, biases, Gemma 2's post-norms and soft-caps, Phi-3's fused
// matrices, Qwen3's q/k norms; one converted to Q8_0 (2 ranks; 3 would cut its blocks: refused), BF16, FP8
// (a scale per row) and ternary (one per tensor);
// the bundled F16 model; exact f32 numerics,
// tests/pin_exact_numerics.cpp: with int8 activations a reordered sum may flip an activation's rounding):
//   logits of a 24-token prefill (every row an output) and of 8 decode steps within 1e-5 of the whole
//   model's; 16 greedy tokens and 16 seeded sampled tokens identical; no allocation in decode steps on any
//   rank.
// Mixtures of experts (every expert by columns, model/shard.h): the HF fixtures Mixtral, Qwen2-MoE (shared
// expert), Qwen3-MoE, gpt-oss (F32, and MXFP4 experts at 2 ranks), and GGUF files (tests/moe_gguf.h) of
// Qwen2-MoE with Q8_0 and Q4_K experts, Mixtral with Q8_0 experts and gpt-oss in F32, the same checks; no
// allocation per step on one.
// A batch rank 0 refuses (2 ranks): the ranks stay in step (Context::ranks_in_step) and the next steps run.
// And the refusals: a --tp other than the job's size, and (without collectives, on rank 0) the splits that
// cannot be made: more ranks than heads, a rank's heads across GQA groups, experts (and a shared expert)
// narrower than a block per rank, an F8_E4M3 Wo's head split inside a scale group (and an expert's split
// on its scale groups' boundaries), a Q8_0 column split inside a block.
//
// Exit 0 when every check passed on this rank (mpirun then exits 0 when all ranks did), 1 otherwise.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "alloc_counter.h"
#include "dist/communicator.h"
#include "engine/access.h"
#include "engine/model_impl.h"
#include "engine/tensor_parallel.h"
#include "model/shard.h"
#include "moe_gguf.h"
#include "ultra/convert.h"
#include "ultra/generate.h"

using namespace ultra;
namespace fs = std::filesystem;

namespace {

int g_pass = 0, g_fail = 0, g_rank = 0;

void check(bool ok, const std::string& what) {
  (ok ? g_pass : g_fail)++;
  if (!ok) std::printf("FAIL rank %d: %s\n", g_rank, what.c_str());
}

// The message of what f throws ("" when it does not).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Logits of every row of a prefill of prompt, then of each of decode's tokens fed one step at a time.
std::vector<std::vector<float>> logits_of(const Model& m, const std::vector<int32_t>& prompt,
                                          const std::vector<int32_t>& decode) {
  Context ctx(m, {.n_ctx = 64, .n_batch = 32, .n_outputs = 32, .n_threads = 1});
  Batch b(32);
  for (size_t i = 0; i < prompt.size(); ++i) b.add(prompt[i], (int32_t)i, 0, Output::logits);
  ctx.step(b);
  std::vector<std::vector<float>> out;
  for (size_t i = 0; i < prompt.size(); ++i)
    out.emplace_back(ctx.logits((int)i).begin(), ctx.logits((int)i).end());
  for (size_t i = 0; i < decode.size(); ++i) {
    b.clear();
    b.add(decode[i], (int32_t)(prompt.size() + i), 0, Output::logits);
    ctx.step(b);
    out.emplace_back(ctx.logits(0).begin(), ctx.logits(0).end());
  }
  return out;
}

std::vector<int32_t> generated(const Model& m, const std::vector<int32_t>& prompt, const SamplingParams& sp) {
  Context ctx(m, {.n_ctx = 64, .n_threads = 1});
  ctx.set_sampling(0, sp);
  std::vector<int32_t> got;
  GenerateParams gp;
  gp.n_predict = 16;
  gp.ignore_eos = true;
  generate(ctx, prompt, gp, [&](int32_t t, Context&, int) {
    got.push_back(t);
    return true;
  });
  return got;
}

// tol: 1e-5, the f32 noise of summing the row-split projections' outputs in another order (logits of
// magnitude 5 to 15); Gemma 2's embedding scale and post-norms (the norm of each projection's output)
// amplify it to about 2e-5 on logits of 13: 3e-5 there.
void compare(const fs::path& path, int size, double tol = 1e-5) {
  const std::string name = path.filename().string();
  const Model split = Model::load(path.string(), {.tp = size, .tp_timeout_s = 30});
  if (g_rank != 0) {
    run_tp_follower(split);
    return;
  }
  const Model whole = Model::load(path.string());
  const int V = whole.info().n_vocab;
  std::vector<int32_t> prompt(24), decode(8);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = (int32_t)((i * 7919 + 13) % (size_t)V);
  for (size_t i = 0; i < decode.size(); ++i) decode[i] = (int32_t)((i * 104729 + 5) % (size_t)V);
  const auto a = logits_of(whole, prompt, decode), b = logits_of(split, prompt, decode);
  double d = 0, big = 0;
  for (size_t r = 0; r < a.size(); ++r)
    for (size_t i = 0; i < a[r].size(); ++i) {
      d = std::max(d, (double)std::fabs(a[r][i] - b[r][i]));
      big = std::max(big, (double)std::fabs(a[r][i]));
    }
  std::printf("[tp %d] %-18s max |split - whole| logits = %.3g over %zu rows (max |logit| %.3g)\n", size,
              name.c_str(), d, a.size(), big);
  check(d < tol, name + ": logits within " + std::to_string(tol));
  check(generated(whole, prompt, SamplingParams::greedy()) ==
            generated(split, prompt, SamplingParams::greedy()),
        name + ": greedy tokens identical");
  SamplingParams sp;
  sp.temperature = 0.9f;
  sp.top_k = 0;
  sp.seed = 1234;
  const auto ws = generated(whole, prompt, sp), ss = generated(split, prompt, sp);
  check(ws == ss, name + ": seeded sampled tokens identical");
}

// Context::copy_seq on a split model (the server's n > 1 choices): every rank copies its shard of the KV
// cache. A prompt prefilled in slot 0, copied to slot 1 and decoded there 8 steps: logits within tol of the
// whole model's, and slot 0's next step unchanged.
void copied_sequence(const fs::path& path, int size) {
  const Model split = Model::load(path.string(), {.tp = size, .tp_timeout_s = 30});
  if (g_rank != 0) {
    run_tp_follower(split);
    return;
  }
  auto run = [](const Model& m) {
    Context ctx(m, {.n_ctx = 64, .n_slots = 2, .n_batch = 16, .n_outputs = 2, .n_threads = 1});
    Batch b(16);
    const std::vector<int32_t> prompt = {1, 50, 300, 7, 9, 1000, 42, 3};
    b.add_sequence(prompt, 0, 0, Output::none);
    ctx.step(b);
    ctx.copy_seq(0, 1, (int)prompt.size());
    std::vector<float> out;
    for (int i = 0; i < 8; ++i) {
      b.clear();
      b.add(100 + 37 * i, (int32_t)prompt.size() + i, 1, Output::logits);
      if (i == 0) b.add(5, (int32_t)prompt.size(), 0, Output::logits);
      ctx.step(b);
      for (int r = 0; r < b.size(); ++r) out.insert(out.end(), ctx.logits(r).begin(), ctx.logits(r).end());
    }
    return out;
  };
  const auto a = run(Model::load(path.string())), b = run(split);
  double d = a.size() == b.size() ? 0 : INFINITY;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) d = std::max(d, (double)std::fabs(a[i] - b[i]));
  std::printf("[tp %d] copy_seq: max |split - whole| logits = %.3g\n", size, d);
  check(d < 1e-5, "copy_seq: the copied slot's logits within 1e-5");
}

// No allocation per decode step on any rank: rank 0 counts its own thread's allocations over each window of
// 10 decode steps (after a prefill and 2 warm-up steps), the others over the same steps (tp_follow's hook
// after each step). As test_dist: Open MPI may grow a free list once in a while, so one window of three
// without any allocation passes.
void no_allocation_per_step(const fs::path& path, int size) {
  const Model split = Model::load(path.string(), {.tp = size, .tp_timeout_s = 30});
  constexpr int kWarm = 3, kWindow = 10;  // steps: the prefill and 2 decode steps, then 3 windows
  std::vector<long> at;                   // allocations of this thread after each step
  at.reserve(64);
  count_this_thread();
  g_counting = true;
  if (g_rank != 0) {
    tp_follow(*detail::impl(split).data, [&](TpCmd c) {
      if (c == TpCmd::step) at.push_back(g_allocs_mine.load());
    });
  } else {
    Context ctx(split, {.n_ctx = 64, .n_threads = 1});
    ctx.set_sampling(0, SamplingParams::greedy());
    Batch b(16);
    const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8};
    b.add_sequence(prompt, 0, 0, Output::sample);
    ctx.step(b);
    at.push_back(g_allocs_mine.load());
    for (int i = 0; i < kWarm - 1 + 3 * kWindow; ++i) {
      const int32_t t = ctx.sampled(b.size() - 1);
      b.clear();
      b.add(t, (int32_t)prompt.size() + i, 0, Output::sample);
      ctx.step(b);
      at.push_back(g_allocs_mine.load());
    }
  }
  g_counting = false;
  bool ok = false;
  std::string counts;
  for (int w = 0; w < 3 && at.size() >= kWarm + 3 * kWindow; ++w) {
    const long n = at[kWarm - 1 + (w + 1) * kWindow] - at[kWarm - 1 + w * kWindow];
    ok = ok || n == 0;
    counts += std::to_string(n) + " ";
  }
  check(ok,
        "decode steps allocate nothing (" + std::to_string(at.size()) + " steps; windows: " + counts + ")");
}

// Rank 0 idle for longer than the collectives' timeout (a server between requests): the other ranks wait on
// (their wait for the next step settles instead of failing), and the next steps give the whole model's
// greedy tokens. Before them, a batch rank 0 refuses (a token past the vocabulary): refused before the step
// reaches the other ranks, it leaves them in step (Context::ranks_in_step) and waiting for nothing.
void idle_leader(const fs::path& path, int size) {
  const Model split = Model::load(path.string(), {.tp = size, .tp_timeout_s = 1});
  if (g_rank != 0) {
    run_tp_follower(split);
    return;
  }
  const std::vector<int32_t> prompt = {1, 50, 300, 7};
  const auto want = generated(Model::load(path.string()), prompt, SamplingParams::greedy());
  Context ctx(split, {.n_ctx = 64, .n_threads = 1});
  ctx.set_sampling(0, SamplingParams::greedy());
  Batch b(8);
  b.add(1, 0, 0);
  b.add(split.info().n_vocab, 1, 0, Output::sample);
  const std::string refused = error_of([&] { ctx.step(b); });
  check(refused.find("out of range") != std::string::npos && ctx.ranks_in_step(),
        "a refused batch leaves the ranks in step: " + refused);
  b.clear();
  b.add_sequence(prompt, 0, 0, Output::sample);
  std::vector<int32_t> got;
  std::string e = error_of([&] {
    for (int i = 0; i < 16; ++i) {
      ctx.step(b);
      got.push_back(ctx.sampled(b.size() - 1));
      if (i == 1) std::this_thread::sleep_for(std::chrono::milliseconds(2500));
      b.clear();
      b.add(got.back(), (int32_t)(prompt.size() + i), 0, Output::sample);
    }
  });
  check(e.empty() && got == want, "steps after 2.5 s idle (timeout 1 s) give the same tokens: " + e);
}

// `test_tp --hang` (ctest test_tp_hang, 2 ranks): rank 1 stops answering after 3 steps (a rank that hangs;
// one that dies ends the job through mpirun at once); rank 0's next step must end with the communicator's
// error within seconds (collectives time out after 2 s here), not hang, and the context says its ranks are
// out of step (Context::ranks_in_step). Rank 0 prints HANG-CHECK PASSED when it did, then ends the job
// (MPI_Abort: rank 1 is still asleep); ctest looks for that line.
int hang_check(dist::Communicator& comm, const fs::path& path) {
  const Model split = Model::load(path.string(), {.tp = comm.size(), .tp_timeout_s = 2});
  if (comm.rank() != 0) {
    int steps = 0;
    tp_follow(*detail::impl(split).data, [&](TpCmd c) {
      if (c == TpCmd::step && ++steps == 3) std::this_thread::sleep_for(std::chrono::seconds(60));
    });
    return 1;
  }
  Context ctx(split, {.n_ctx = 64, .n_threads = 1});
  ctx.set_sampling(0, SamplingParams::greedy());
  Batch b(4);
  const auto t0 = std::chrono::steady_clock::now();
  double s = 0;
  std::string e;
  try {
    for (int i = 0; i < 10; ++i) {
      b.clear();
      b.add(1 + i, i, 0, Output::sample);
      ctx.step(b);
    }
  } catch (const Error& err) {
    s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    e = err.what();
  }
  std::printf("rank 0: after %.1f s: %s (ranks in step: %d)\n", s, e.c_str(), (int)ctx.ranks_in_step());
  const bool ok =
      !e.empty() && s < 10 && e.find("no answer within 2 s") != std::string::npos && !ctx.ranks_in_step();
  if (ok) std::printf("HANG-CHECK PASSED\n");
  std::fflush(stdout);
  comm.abort(ok ? 0 : 1);
  return 1;  // not reached
}

// `test_tp --stop` (ctest test_tp_stop, 2 ranks): a step that throws on rank 0 mid-forward, after the other
// ranks were sent it (rank 0's communicator wrapped so that one all-reduce throws before sending anything, as
// an error of rank 0's own would): the step's error, and the context says its ranks are out of step
// although the communicator is not broken (the other ranks wait in that all-reduce). Rank 0 prints
// STOP-CHECK PASSED when it did, then ends the job (MPI_Abort); ctest looks for that line.
class ThrowAtAllReduce final : public dist::Communicator {
 public:
  explicit ThrowAtAllReduce(std::shared_ptr<dist::Communicator> c) : c_(std::move(c)) {
    capacity_ = c_->capacity();
  }
  int armed = -1;  // the armed-th all-reduce from now on throws (-1: none)

  const char* name() const override { return c_->name(); }
  int rank() const override { return c_->rank(); }
  int size() const override { return c_->size(); }
  void all_reduce_sum(float* x, size_t n) override {
    if (armed > 0 && --armed == 0) fail("test: rank 0 stops in the middle of a step");
    c_->all_reduce_sum(x, n);
  }
  void all_reduce_sum_bf16(uint16_t* x, size_t n) override { c_->all_reduce_sum_bf16(x, n); }
  void all_gather(const float* in, size_t n, float* out) override { c_->all_gather(in, n, out); }
  void broadcast(void* data, size_t bytes, int root) override { c_->broadcast(data, bytes, root); }
  void barrier() override { c_->barrier(); }
  bool settle(double seconds) override { return c_->settle(seconds); }
  bool broken() const override { return c_->broken(); }
  [[noreturn]] void abort(int code) override {
    c_->abort(code);
    std::_Exit(code);  // not reached
  }

 private:
  std::shared_ptr<dist::Communicator> c_;
};

int stop_check(dist::Communicator& comm, const fs::path& path) {
  const Model split = Model::load(path.string(), {.tp = comm.size(), .tp_timeout_s = 30});
  if (comm.rank() != 0) {
    run_tp_follower(split);
    return 1;
  }
  ModelData& m = *detail::impl(split).data;
  auto wrap = std::make_shared<ThrowAtAllReduce>(m.comm);
  m.comm = wrap;
  Context ctx(split, {.n_ctx = 64, .n_threads = 1});
  Batch b(4);
  b.add(1, 0, 0, Output::sample);
  ctx.step(b);
  const bool before = ctx.ranks_in_step();
  wrap->armed = 2;  // the second all-reduce of the next step: mid-forward
  b.clear();
  b.add(2, 1, 0, Output::sample);
  const std::string e = error_of([&] { ctx.step(b); });
  std::printf("rank 0: %s (ranks in step: before %d, after %d; communicator broken: %d)\n", e.c_str(),
              (int)before, (int)ctx.ranks_in_step(), (int)m.comm->broken());
  const bool ok = before && e.find("stops in the middle") != std::string::npos && !ctx.ranks_in_step() &&
                  !m.comm->broken();
  if (ok) std::printf("STOP-CHECK PASSED\n");
  std::fflush(stdout);
  comm.abort(ok ? 0 : 1);
  return 1;  // not reached
}

}  // namespace

int main(int argc, char** argv) {
  const fs::path root(ULTRA_SOURCE_DIR);
  int size = 0;
  {
    dist::DistOptions o;
    o.capacity = 16;
    auto comm = dist::make_mpi_communicator(o);  // keeps MPI initialised for the whole program
    g_rank = comm->rank();
    size = comm->size();
    if (argc > 1 && std::string(argv[1]) == "--hang") return hang_check(*comm, root / "models/target.gguf");
    if (argc > 1 && std::string(argv[1]) == "--stop")
      return stop_check(*comm, root / "tests/fixtures/hf/llama_gqa");
    try {
      for (const char* f : {"llama_gqa", "qwen2_bias", "phi3_short", "qwen3"})
        compare(root / "tests/fixtures/hf" / f, size);
      compare(root / "tests/fixtures/hf/gemma2", size, 3e-5);
      compare(root / "models/target.gguf", size);
      // The fixture converted to GGUF in Q8_0 (Wo's and Wdown's column splits in whole 32-column blocks),
      // BF16, FP8 and ternary (their scales kept by the column splits), by every rank for itself.
      for (const char* type : {"q8_0", "bf16", "fp8", "ternary"}) {
        const fs::path gguf = fs::temp_directory_path() / ("ultra_test_tp_" + std::to_string(getpid()) + "_" +
                                                           std::to_string(g_rank) + "_" + type + ".gguf");
        ConvertOptions co;
        co.out_type = type;
        co.threads = 1;
        convert_hf_to_gguf((root / "tests/fixtures/hf/llama_gqa").string(), gguf.string(), co);
        if (size == 3 && std::string(type) == "q8_0") {  // heads of 16 columns: one per rank cuts the blocks
          const std::string e = error_of([&] { Model::load(gguf.string(), {.tp = size}); });
          check(e.find("would be split inside its 32-element Q8_0 blocks") != std::string::npos,
                "Q8_0 heads of 16 columns over 3 ranks refused: " + e);
        } else {
          compare(gguf, size);
        }
        fs::remove(gguf);
      }
      // Mixtures of experts (every expert and the shared expert split by columns, the router on every
      // rank): the HF fixtures in F32 (gpt-oss's biased experts and sinks; its MXFP4 experts of 64 columns
      // are two 32-column blocks: 3 ranks refused), and GGUF files of quantized experts (tests/moe_gguf.h):
      // Qwen2-MoE's experts and shared expert of 96 columns in Q8_0 (3 blocks), and of 512 in Q4_K (two
      // 256-column blocks: 3 ranks refused); Mixtral's (arch llama) in Q8_0, gpt-oss's in F32. gpt-oss's F32
      // fixture has 4 layers (the others 2), each two sums over ranks, and reaches 1.2e-5 (2 ranks) to 1.4e-5
      // (3) on logits of 6.4 (summing the ranks' parts before adding the residual leaves it there): 2e-5 (a
      // misplaced slice or a bias added twice is off by 1e-2 or more).
      for (const char* f : {"mixtral", "qwen2_moe", "qwen3_moe"})
        compare(root / "tests/fixtures/hf" / f, size);
      compare(root / "tests/fixtures/hf/gpt_oss", size, 2e-5);
      if (size == 2) {
        compare(root / "tests/fixtures/hf/gpt_oss_mxfp4", size);
      } else {
        const std::string e =
            error_of([&] { Model::load((root / "tests/fixtures/hf/gpt_oss_mxfp4").string(), {.tp = size}); });
        check(e.find("expert FFN width 64 is too narrow for 3 ranks (32-column blocks)") != std::string::npos,
              "MXFP4 experts of 2 blocks over 3 ranks refused: " + e);
      }
      struct MoeCase {
        const char* arch;
        GgmlType experts;
      };
      for (const MoeCase c : {MoeCase{"qwen2moe", GgmlType::Q8_0}, MoeCase{"qwen2moe", GgmlType::Q4_K},
                              MoeCase{"llama", GgmlType::Q8_0}, MoeCase{"gpt-oss", GgmlType::F32}}) {
        const fs::path gguf = fs::temp_directory_path() /
                              ("ultra_test_tp_" + std::to_string(getpid()) + "_" + std::to_string(g_rank) +
                               "_" + c.arch + "_" + std::string(type_name(c.experts)) + ".gguf");
        const bool q4k = c.experts == GgmlType::Q4_K;
        test::MoeSpec ms;
        ms.arch = c.arch;
        ms.expert_type = c.experts;
        ms.dim = q4k ? 256 : 64;  // the experts' rows: whole Q4_K blocks
        ms.expert_ffn = ms.shexp_ffn = q4k ? 512 : 96;
        test::write_moe_gguf(gguf.string(), ms);
        if (size == 3 && q4k) {
          const std::string e = error_of([&] { Model::load(gguf.string(), {.tp = size}); });
          check(e.find("expert FFN width 512 is too narrow for 3 ranks (256-column blocks)") !=
                    std::string::npos,
                "Q4_K experts of 2 blocks over 3 ranks refused: " + e);
        } else {
          compare(gguf, size);
        }
        fs::remove(gguf);
      }
      copied_sequence(root / "models/target.gguf", size);
      no_allocation_per_step(root / "models/target.gguf", size);
      no_allocation_per_step(root / "tests/fixtures/hf/qwen2_moe", size);
      if (size == 2) idle_leader(root / "models/target.gguf", size);

      const std::string fixture = (root / "tests/fixtures/hf/llama_gqa").string();
      const std::string e = error_of([&] { Model::load(fixture, {.tp = size + 1}); });
      check(e.find("MPI ranks") != std::string::npos, "--tp other than the job's size refused: " + e);
      if (g_rank == 0) {
        auto m = load_model(fixture);
        const std::string heads = error_of([&] { shard_model(*m, 0, 5); });
        check(heads.find("more ranks than the 4 attention heads") != std::string::npos, "5 ranks: " + heads);
        auto odd = load_model(fixture);  // 8 heads of 4 KV heads over 3 ranks: rank 1 holds 2, 3, 4
        odd->hp.n_heads = 8;
        odd->hp.n_kv_heads = 4;
        const std::string gqa = error_of([&] { shard_model(*odd, 0, 3); });
        check(gqa.find("query heads of 4 KV heads do not split over 3 ranks (rank 1") != std::string::npos,
              "GQA groups cut: " + gqa);
        auto moe = load_model((root / "tests/fixtures/hf/qwen2_moe").string());  // experts 64, shared 96
        {  // rank 1 of 2's shard: half of each expert and of the shared expert, scratch sized for those
          auto half = load_model((root / "tests/fixtures/hf/qwen2_moe").string());
          const size_t whole = half->weight_bytes;
          const auto* d0 = static_cast<const uint8_t*>(half->layers[1].down_exps[3].data);
          shard_model(*half, 1, 2);
          const HParams& hp = half->hp;
          const WeightView& d = half->layers[1].down_exps[3];
          check(hp.expert_ffn_dim == 32 && hp.shexp_ffn_dim == 48 && hp.max_ffn_dim() == 48 && d.cols == 32 &&
                    d.data == d0 + 32 * 4 && half->layers[1].gate_exps[3].rows == 32 &&
                    half->weight_bytes < whole * 3 / 5,
                "Qwen2-MoE's shard of rank 1 of 2: expert FFN " + std::to_string(hp.expert_ffn_dim) +
                    ", shared " + std::to_string(hp.shexp_ffn_dim) + ", scratch width " +
                    std::to_string(hp.max_ffn_dim()) + ", weights " + std::to_string(half->weight_bytes) +
                    " of " + std::to_string(whole));
        }
        for (int e = 0; e < moe->hp.n_expert; ++e) {  // Q8_0: 2 blocks per expert row, 3 of the shared one
          auto& d = const_cast<WeightView&>(moe->layers[1].down_exps[e]);
          d.type = GgmlType::Q8_0;
          d.row_bytes = 2 * sizeof(BlockQ8_0);
        }
        const std::string experts = error_of([&] { shard_model(*moe, 0, 3); });
        check(experts.find("expert FFN width 64 is too narrow for 3 ranks (32-column blocks)") !=
                  std::string::npos,
              "Q8_0 experts over 3 ranks: " + experts);
        moe->layers[0].w_down_shexp.type = GgmlType::Q4_K;  // 96 columns: not one 256-column block
        const std::string shexp = error_of([&] { shard_model(*moe, 0, 2); });
        check(shexp.find("shared expert FFN width 96 is too narrow for 2 ranks (256-column blocks)") !=
                  std::string::npos,
              "Q4_K shared expert: " + shexp);
        // FP8 checkpoints' scales per group of columns: an expert's down projection with groups of W / 2 - 1
        // columns (the last one partial) splits on group boundaries, rank 1 taking the rest of the row and
        // its scales from the second group; Wo with groups that a head split would cut is refused.
        {
          auto f8 = load_model((root / "tests/fixtures/hf/mixtral").string());
          static std::vector<float> scales;
          auto& d = const_cast<WeightView&>(f8->layers[0].down_exps[2]);
          const int64_t W = d.cols, g = W / 2 - 1;
          d.type = GgmlType::F8_E4M3;
          d.row_bytes = (size_t)W;
          d.scale_group = g;
          d.scale_row_stride = (W + g - 1) / g;
          scales.assign((size_t)(d.rows * d.scale_row_stride), 1.0f);
          d.scale = scales.data();
          const uint8_t* data = static_cast<const uint8_t*>(d.data);
          shard_model(*f8, 1, 2);
          const WeightView& s1 = f8->layers[0].down_exps[2];
          check(s1.cols == W - g && s1.scale == scales.data() + 1 && s1.scale_group == g &&
                    static_cast<const uint8_t*>(s1.data) == data + g,
                "F8_E4M3 expert with " + std::to_string(g) +
                    "-column scale groups: rank 1 of 2 holds columns " + std::to_string(g) + " .. " +
                    std::to_string(W - 1) + " (got " + std::to_string(s1.cols) + ")");
        }
        {
          auto f8 = load_model((root / "tests/fixtures/hf/mixtral").string());
          static std::vector<float> scales;
          auto& o = const_cast<WeightView&>(f8->layers[0].wo);
          const int64_t g = o.cols / 2 - 1;  // 2 ranks cut Wo at column cols / 2 (half the heads)
          o.type = GgmlType::F8_E4M3;
          o.row_bytes = (size_t)o.cols;
          o.scale_group = g;
          o.scale_row_stride = (o.cols + g - 1) / g;
          scales.assign((size_t)(o.rows * o.scale_row_stride), 1.0f);
          o.scale = scales.data();
          const std::string fp8 = error_of([&] { shard_model(*f8, 0, 2); });
          check(fp8.find("layer 0's output projection would be split inside its " + std::to_string(g) +
                         "-column F8_E4M3 scale groups") != std::string::npos,
                "F8_E4M3 Wo's scale groups: " + fp8);
        }
        m->layers[1].w_down.type = GgmlType::Q8_0;  // 128 columns: 4 blocks, 3 ranks cut no block
        m->layers[1].w_down.row_bytes = 4 * sizeof(BlockQ8_0);
        m->layers[1].wo.type = GgmlType::Q8_0;  // 64 columns, 2 blocks: 4 heads of 16 over 4 ranks cut them
        m->layers[1].wo.row_bytes = 2 * sizeof(BlockQ8_0);
        const std::string blocks = error_of([&] { shard_model(*m, 0, 4); });
        check(blocks.find("inside its 32-element") != std::string::npos, "Q8_0 blocks: " + blocks);
      }
    } catch (const std::exception& e) {
      check(false, std::string("unexpected error: ") + e.what());
      comm->abort(1);
    }
    comm->barrier();
  }
  std::printf("rank %d of %d: %d passed, %d failed\n", g_rank, size, g_pass, g_fail);
  return g_fail ? 1 : 0;
}
