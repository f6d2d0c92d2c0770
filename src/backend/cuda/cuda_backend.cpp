#include "backend/cuda/cuda_backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>

#include "backend/cuda/backend_kernels.h"
#include "core/error.h"
#include "kv/layout.h"

namespace ultra {

static_assert(SamplingParams::kMaxSpeculativeTopK == cuda::kSamplerMaxTopK,
              "Output::propose / verify rows need the sampler's one-pass top_k path");

namespace {

// The settings that are process-wide switches of the kernels (tuning.h: launch mode, gemv choice), applied
// where the environment set them; they stay set after this backend.
void apply_process_cuda_tuning(const cuda::CudaTuning& t) {
  if (t.pdl >= 0) {
    cuda::set_programmatic_launch(t.pdl > 0);
    if (t.pdl > 0) cuda::set_programmatic_launch_level(t.pdl);
  }
  if (t.gemv_set) cuda::tuning::set_gemv_tuning(t.gemv);
  if (t.gemv_l2 >= 0) cuda::tuning::set_gemv_l2_all(t.gemv_l2 != 0);
  if (t.gemv_l1 >= 0) cuda::tuning::set_gemv_l1_all(t.gemv_l1 != 0);
}

// This backend's attention plans' tuning: the process-wide values (tuning.h) where the environment set none.
cuda::AttentionTuning backend_attention_tuning(const cuda::CudaTuning& t) {
  cuda::AttentionTuning a = cuda::process_attention_tuning();
  if (t.attention_rows) a.tiled = 1;
  if (t.attention_pdl >= 0) a.pdl = t.attention_pdl != 0;
  if (t.attn_min_chunk >= 0) a.min_chunk = cuda::attention_min_chunk(t.attn_min_chunk);
  if (t.attn_combine_pdl >= 0) a.combine_pdl = t.attn_combine_pdl != 0;
  if (t.attn_trigger >= 0) a.trigger = t.attn_trigger;
  return a;
}

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const ModelData& m, const ContextParams& params, int n_sample) {
  return std::make_unique<CudaBackend>(m, params, n_sample);
}

CudaBackend::CudaBackend(const ModelData& model, const ContextParams& params, int n_sample,
                         const cuda::CudaTuning& tuning)
    : m_(model), p_(params), n_sample_(n_sample), tune_(tuning) {
  const HParams& hp = m_.hp;
  if (hp.moe() && (hp.n_expert > cuda::kMoeMaxRouted || hp.n_expert_used > hp.n_expert ||
                   hp.n_expert_used > cuda::kMoeMaxUsed))
    fail(
        "CUDA backend: {} experts ({} used) per layer; the CUDA kernels take up to {} experts and {} used "
        "(use "
        "--backend cpu)",
        hp.n_expert, hp.n_expert_used, cuda::kMoeMaxRouted, cuda::kMoeMaxUsed);
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0)
    fail("CUDA backend: no CUDA device is available (use the CPU backend)");
  cuda::check(cuda::query_device(0, &dev_), "device query");

  // Sizes first: refuse before allocating anything when the device cannot hold the context. The step's
  // shape (rows, outputs, KV layout) comes first, then the device's plans for it, then every buffer.
  const cuda::CudaSizePlan shape = cuda::plan_cuda_sizes(hp, p_, {});
  const KvLayerView proto = shape.kv.view(nullptr, nullptr);
  apply_process_cuda_tuning(tune_);
  if (!tune_.skip_list.empty())
    fmt::print(stderr,
               "ULTRA_CUDA_SKIP={}: these ops are left out of every step (timing only; results are wrong)\n",
               tune_.skip_list);
  const cuda::AttentionTuning attn = backend_attention_tuning(tune_);
  eager_plan_ = cuda::plan_attention(dev_, proto, hp.n_heads, shape.n_rows, 0, attn);
  size_t attn_ws = eager_plan_.workspace_bytes;
  for (size_t i = 0; i < cuda::StepGraphs::kBuckets.size(); ++i) {
    if (cuda::StepGraphs::kBuckets[i] > shape.n_rows) continue;
    bucket_plans_[i] = cuda::plan_attention(dev_, proto, hp.n_heads, cuda::StepGraphs::kBuckets[i], 0, attn);
    attn_ws = std::max(attn_ws, bucket_plans_[i].workspace_bytes);
  }
  cuda::check(cuda::plan_sampler(dev_, shape.n_out, hp.n_vocab, shape.max_hist, &sampler_plan_),
              "sampler plan (the vocabulary may be too large for one block's shared memory)");
  weights_ = std::make_unique<cuda::DeviceWeights>(m_, p_.n_ctx);
  plan_ = cuda::plan_cuda_sizes(hp, p_,
                                {weights_->bytes(), cuda::DeviceWeights::max_lowbit_bf16_elems(m_), attn_ws,
                                 sampler_plan_.workspace_bytes});
  size_t free_b = 0, total_b = 0;
  cuda::check(cudaMemGetInfo(&free_b, &total_b), "memory query");
  const size_t need = plan_.device_bytes();
  const Footprint fp = plan_.footprint();
  if (need > free_b)
    fail(
        "CUDA backend: the context needs {} (weights {}, KV cache {}, scratch {}) but the device has {} free "
        "of "
        "{}; lower -c or the number of slots",
        cuda::format_mib(need), cuda::format_mib(fp.weights), cuda::format_mib(fp.kv),
        cuda::format_mib(need - fp.weights - fp.kv), cuda::format_mib(free_b), cuda::format_mib(total_b));

  cuda::check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "stream creation");
  // Every allocation below takes its size from the plan, in the plan's order (CudaSizePlan::each_device).
  weights_->upload(mem_.alloc(plan_.weights, "weights"), p_.upload_progress);

  // KV cache (kv/layout.h): one K and one V buffer per layer, [n_slots, n_kv_heads, n_ctx, head_dim], zeroed.
  ops_mem_.kv = kv_allocate(plan_.kv, [&](size_t bytes) { return mem_.alloc(bytes, "KV cache"); });
  for (const KvLayerView& v : ops_mem_.kv) {
    cuda::check(cudaMemsetAsync(v.k, 0, plan_.kv_buffer, stream_), "KV clear");
    cuda::check(cudaMemsetAsync(v.v, 0, plan_.kv_buffer, stream_), "KV clear");
  }

  // Activations.
  auto f = [&](size_t bytes, const char* what) { return static_cast<float*>(mem_.alloc(bytes, what)); };
  for (const auto& [buf, bytes] : {std::pair{&b_.x, plan_.x},
                                   {&b_.xb, plan_.xb},
                                   {&b_.q, plan_.q},
                                   {&b_.k, plan_.k},
                                   {&b_.v, plan_.v},
                                   {&b_.att, plan_.att},
                                   {&b_.hb, plan_.hb},
                                   {&b_.hb2, plan_.hb2},
                                   {&b_.out_x, plan_.out_x}})
    *buf = f(bytes, "activations");
  b_.logits = f(plan_.logits, "logits");
  ops_mem_.qkv1 = f(plan_.qkv1, "activations");
  ops_mem_.gu1 = f(plan_.gu1, "activations");
  if (plan_.moe) {
    b_.router = f(plan_.router, "router logits");
    b_.expert_ids = static_cast<int32_t*>(mem_.alloc(plan_.expert_ids, "expert choice"));
    b_.expert_w = f(plan_.expert_w, "expert weights");
    if (plan_.shexp_out) b_.shexp_out = f(plan_.shexp_out, "shared expert");
    ops_mem_.moe = cuda::moe_scratch(mem_.alloc(plan_.moe_scratch, "expert scratch"), plan_.n_rows,
                                     hp.n_expert_used, hp.n_expert, hp.expert_ffn_dim, hp.dim);
  }
  token_log_ = static_cast<int32_t*>(mem_.alloc(plan_.token_log, "token log"));
  d_link_ = static_cast<cuda::LinkedTokens*>(mem_.alloc(plan_.linked, "linked tokens"));
  proposals_ = static_cast<cuda::SpecDist*>(mem_.alloc(plan_.proposals, "kept proposals"));
  cuda::check(cudaMemsetAsync(d_link_, 0, sizeof(cuda::LinkedTokens), stream_), "clear");
  cuda::check(cudaMemsetAsync(token_log_, 0, plan_.token_log, stream_), "clear");

  cuda::check(mm_.init(mem_.alloc(plan_.matmul_ws, "matmul workspace"), plan_.matmul_ws), "cuBLASLt init");
  ops_mem_.mm = &mm_;
  if (plan_.attention_ws) ops_mem_.attention_ws = mem_.alloc(plan_.attention_ws, "attention workspace");
  sampler_ws_ = mem_.alloc(plan_.sampler_ws, "sampler workspace");
  cuda::check(cuda::sampler_workspace_init(sampler_plan_, sampler_ws_, stream_), "sampler workspace init");

  // Step IO: pinned host blocks and their device mirrors.
  void* d_in = mem_.alloc(plan_.step_in, "step inputs");
  void* d_out = mem_.alloc(plan_.step_out, "step results");
  io_ = std::make_unique<cuda::StepIo>(plan_.io, plan_.n_out, hp.n_vocab, d_in, d_out);

  ops_ = std::make_unique<cuda::CudaOps>(*weights_, ops_mem_, tune_, stream_);
  if (tune_.profile) {
    prof_ = std::make_unique<cuda::StepProfiler>(stream_);
    prof_ops_ = std::make_unique<cuda::ProfiledOps>(*ops_, *prof_);
  }
  if (p_.gpu_timing)
    for (auto& pair : gap_ev_)
      for (cudaEvent_t& ev : pair) cuda::check(cudaEventCreate(&ev), "event creation");
  cuda::check(cudaStreamSynchronize(stream_), "initialisation");
}

CudaBackend::~CudaBackend() {
  if (stream_) cudaStreamSynchronize(stream_);
  prof_ops_.reset();
  prof_.reset();  // prints the profile
  for (auto& pair : gap_ev_)
    for (cudaEvent_t ev : pair)
      if (ev) cudaEventDestroy(ev);
  io_.reset();
  if (stream_) cudaStreamDestroy(stream_);
}

void CudaBackend::poison_kv(int seq, int from) {
  for (const KvLayerView& v : ops_mem_.kv)
    kv_poison(v, seq, from, [&](uint8_t* p, size_t n) {
      cuda::check(cudaMemsetAsync(p, kKvPoisonByte, n, stream_), "KV poison");
    });
  cuda::check(cudaStreamSynchronize(stream_), "KV poison");
}

void CudaBackend::copy_kv(int from, int to, int n) {
  if (n <= 0) return;
  for (const KvLayerView& v : ops_mem_.kv)
    kv_copy(v, from, to, n, [&](uint8_t* dst, const uint8_t* src, size_t width, size_t height, size_t pitch) {
      cuda::check(cudaMemcpy2DAsync(dst, pitch, src, pitch, width, height, cudaMemcpyDeviceToDevice, stream_),
                  "KV copy");
    });
  cuda::check(cudaMemcpyAsync(token_log_ + (size_t)to * p_.n_ctx, token_log_ + (size_t)from * p_.n_ctx,
                              (size_t)n * sizeof(int32_t), cudaMemcpyDeviceToDevice, stream_),
              "KV copy");
}

void CudaBackend::enqueue(int n, int n_out, bool sample, const cuda::AttentionPlan& plan, int parity) {
  const cuda::StepIoLayout& lay = io_->layout();
  auto begin = [&](const char* op) {
    if (prof_) prof_->begin(op);
  };
  auto end = [&] {
    if (prof_) prof_->end();
  };
  begin("input upload");
  cuda::check(cuda::copy_kernel(io_->dev_in(), io_->host_in(parity), lay.in_bytes, stream_), "input upload");
  end();
  int32_t* tok = io_->dev_in<int32_t>(lay.tok);
  const TokenFeed* feed = io_->dev_in<const TokenFeed>(lay.feed);
  const int32_t* pos = io_->dev_in<const int32_t>(lay.pos);
  const int32_t* seq = io_->dev_in<const int32_t>(lay.seq);
  begin("token log");
  // The previous step's sampled tokens are still in the result mirror: this step's sampler writes it later.
  cuda::check(cuda::token_log_write(token_log_, p_.n_ctx, p_.n_slots, tok, feed, pos, seq,
                                    io_->dev_tokens_out(), d_link_, n, stream_),
              "token log");
  end();
  StepRows rows;
  rows.n = n;
  rows.token = tok;
  rows.pos = pos;
  rows.seq = seq;
  rows.n_out = n_out;
  rows.out_row = io_->dev_in<const int32_t>(lay.out_row);
  ops_->set_attention_plan(&plan);
  forward(m_.hp, weights_->table(), rows, b_, prof_ops_ ? static_cast<ForwardOps&>(*prof_ops_) : *ops_);
  const cuda::SamplerRow* srow = io_->dev_in<const cuda::SamplerRow>(lay.srow);
  if (n_out > 0) {  // every step: a captured one serves steps with and without rules
    begin("logit rules");
    cuda::check(cuda::logit_rules(b_.logits, m_.hp.n_vocab, n_sample_, srow, n_out,
                                  io_->dev_out<int32_t>(lay.rule_error), stream_),
                "logit rules");
    end();
  }
  if (sample && n_out > 0) {
    cuda::SamplerOutputs out;
    out.token = io_->dev_out<int32_t>(lay.token);
    out.logprob = io_->dev_out<float>(lay.logprob);
    out.top_token = io_->dev_out<int32_t>(lay.top_token);
    out.top_logprob = io_->dev_out<float>(lay.top_logprob);
    out.error = io_->dev_out<int32_t>(lay.error);
    cuda::check(cuda::sample(sampler_plan_, b_.logits, m_.hp.n_vocab, n_sample_, srow, n_out, out,
                             sampler_ws_, stream_),
                "sampler");
    cuda::check(cuda::copy_kernel(io_->host_out(parity), io_->dev_out(), lay.out_bytes, stream_),
                "result download");
  }
}

bool CudaBackend::link(const LinkSource& source) {
  link_ = dynamic_cast<CudaBackend*>(source.backend);
  if (link_ && link_->dev_.device != dev_.device) link_ = nullptr;  // another device: fed through the host
  cuda::LinkedTokens d;
  if (link_) {
    d.log = link_->token_log_;
    d.out = link_->io_->dev_tokens_out();
    d.n_ctx = link_->p_.n_ctx;
    d.n_slots = link_->p_.n_slots;
  }
  cuda::check(cudaMemcpyAsync(d_link_, &d, sizeof d, cudaMemcpyHostToDevice, stream_), "link");
  cuda::check(cudaStreamSynchronize(stream_), "link");
  return link_ != nullptr;
}

void CudaBackend::step(const StepRows& rows, const SampleJob* jobs, int n_jobs, SampleResult* results,
                       TokenLogprob* top, StepStats& stats) {
  submit(rows, jobs, n_jobs, results, top, stats);
  complete(stats);
}

void CudaBackend::submit(const StepRows& rows, const SampleJob* jobs, int n_jobs, SampleResult* results,
                         TokenLogprob* top, StepStats& /*stats*/) {
  if (n_out_q_ >= kInFlight) fail("CUDA backend: {} steps are outstanding already", kInFlight);
  const auto t0 = std::chrono::steady_clock::now();
  const int n = rows.n;
  // The blocks of step i - kInFlight are free again: the engine completed it before submitting this one.
  const int par = (int)(n_submitted_ % kInFlight);
  const cuda::StepGraphs::Shape shape = cuda::StepGraphs::shape(n, rows.n_out, plan_.n_rows, plan_.n_out);
  const cuda::AttentionPlan* plan = shape.slot >= 0 && shape.slot < cuda::StepGraphs::kPrefillSlot
                                        ? &bucket_plans_[shape.slot]
                                        : &eager_plan_;

  // Stage the rows (padding rows: sequence -1) and one sampler row per output.
  const cuda::SamplerSources src{token_log_, p_.n_ctx, plan_.max_hist, proposals_,
                                 link_ ? link_->proposals_ : nullptr};
  io_->stage(par, rows, shape.n, shape.n_out, jobs, n_jobs, logits_rules_, n_logits_rules_, n_sample_, src);
  n_logits_rules_ = 0;  // they were this step's
  io_->new_step();

  // Tokens read from the linked backend: this stream waits (on the device) for its last submitted step.
  for (int i = 0; i < n && rows.feed; ++i) {
    if (rows.feed[i] != TokenFeed::linked_seq && rows.feed[i] != TokenFeed::linked_output) continue;
    if (!link_) fail("CUDA backend: row {} reads a linked backend's token, but none is linked", i);
    if (link_->n_submitted_ > 0)
      cuda::check(
          cudaStreamWaitEvent(stream_, link_->io_->done((int)((link_->n_submitted_ - 1) % kInFlight)), 0),
          "wait for the linked backend");
    break;
  }

  int slot = shape.slot;
  if (prof_) {
    slot = -1;  // every step runs directly, op by op
    prof_->start_step(n == 1);
  }
  const cudaGraphExec_t graph = slot >= 0 ? graphs_.find({slot, par}) : nullptr;
  const bool replay = graph != nullptr;
  const int64_t index = n_submitted_;
  if (replay) {
    if (p_.gpu_timing) cuda::check(cudaEventRecord(gap_ev_[index % 3][0], stream_), "timing event");
    const auto tl = std::chrono::steady_clock::now();
    cuda::check(cudaGraphLaunch(graph, stream_), "graph launch");
    last_launch_us_ =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - tl).count();
    ++n_graph_launches_;
    launch_us_ += last_launch_us_;
    if (p_.gpu_timing) cuda::check(cudaEventRecord(gap_ev_[index % 3][1], stream_), "timing event");
  } else {
    enqueue(shape.n, shape.n_out, slot >= 0 || n_jobs > 0, *plan, par);
    if (slot >= 0) {
      // The slot's first step ran directly (modules loaded, cuBLASLt heuristics cached): capture it, for
      // both sets of pinned blocks at once (a capture runs nothing), so that no later step runs directly.
      cuda::check(cudaStreamSynchronize(stream_), "step");
      for (int q = 0; q < kInFlight; ++q)
        if (!graphs_.find({slot, q}))
          graphs_.capture({slot, q}, stream_, [&] { enqueue(shape.n, shape.n_out, true, *plan, q); });
    }
  }
  cuda::check(cudaEventRecord(io_->done(par), stream_), "step event");
  Outstanding& o = out_q_[index % kInFlight];
  o = {jobs, n_jobs, results, top, par, replay, index, t0};
  ++n_out_q_;
  ++n_submitted_;
}

std::span<const BackendStat> CudaBackend::stats() const {
  stats_view_ = {BackendStat{"graph_launches", (double)n_graph_launches_},
                 BackendStat{"launch_us", launch_us_}, BackendStat{"gpu_idle_us", gpu_idle_us_},
                 BackendStat{"gpu_gaps", (double)n_gpu_gaps_}};
  return stats_view_;
}

void CudaBackend::complete(StepStats& stats) {
  if (n_out_q_ == 0) fail("CUDA backend: no step is outstanding");
  const Outstanding o = out_q_[(n_submitted_ - n_out_q_) % kInFlight];
  --n_out_q_;
  cuda::check(cudaEventSynchronize(io_->done(o.parity)), "step");
  // The step's share of the wall time: from its submission, or from the previous step's end when it was
  // queued behind it (sampling included: it runs inside the step on the device).
  const auto now = std::chrono::steady_clock::now();
  const auto from = std::max(o.t0, last_done_);
  stats.forward_ms += std::chrono::duration<double, std::milli>(now - from).count();
  last_done_ = now;
  if (p_.gpu_timing && o.replay) {
    if (gap_prev_ == o.index - 1) {  // from the end of the previous replay to the start of this one
      float ms = 0;
      if (cudaEventElapsedTime(&ms, gap_ev_[(o.index - 1) % 3][1], gap_ev_[o.index % 3][0]) == cudaSuccess) {
        gpu_idle_us_ += 1e3 * ms;
        ++n_gpu_gaps_;
      }
    }
    gap_prev_ = o.index;
  }
  if (prof_) prof_->finish_step(1e3 * std::chrono::duration<double, std::milli>(now - o.t0).count());
  io_->read_results(o.parity, o.jobs, o.n_jobs, o.results, o.top);
}

const float* CudaBackend::logits(int k) {
  return io_->logits(k, b_.logits, stream_);
}

}  // namespace ultra
