#include "backend/cpu/cpu_backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>

#include "dist/communicator.h"
#include "engine/tensor_parallel.h"
#include "model/moe.h"

namespace ultra {

namespace {

size_t mm_scratch(const ModelData& m, const ContextParams& p) {
  size_t s = cpu::matmul_scratch_floats(m.output, p.n_outputs, p.n_threads);
  auto take = [&](const WeightView& w) {
    s = std::max(s, cpu::matmul_scratch_floats(w, p.n_batch, p.n_threads));
  };
  for (const auto& l : m.layers) {
    for (const WeightView* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down, &l.ffn_gate_inp,
                                &l.w_gate_shexp, &l.w_up_shexp, &l.w_down_shexp})
      take(*w);
    // An expert multiplies at most n_batch rows: a row selects an expert once.
    for (int e = 0; l.gate_exps && e < m.hp.n_expert; ++e)
      for (const WeightView* w : {&l.gate_exps[e], &l.up_exps[e], &l.down_exps[e]}) take(*w);
  }
  return s;
}

// Elements (4 bytes each) of every step buffer: one place for the allocation and the footprint computed
// before it. The MoE buffers are 0 for a dense model.
struct BufferSizes {
  size_t x, xb, q, k, v, att, hb, hb2, acc, out_x, logits, mm, attn;
  size_t router, expert_ids, expert_w, shexp_out, moe_start, moe_row, moe_pair, moe_x, moe_gate, moe_up,
      moe_y;
  size_t vocab_part = 0, vocab_all = 0, tp_wire = 0;  // a split model's only
  size_t total() const {
    return x + xb + q + k + v + att + hb + hb2 + acc + out_x + logits + mm + attn + router + expert_ids +
           expert_w + shexp_out + moe_start + moe_row + moe_pair + moe_x + moe_gate + moe_up + moe_y +
           vocab_part + vocab_all + tp_wire;
  }
};

// Output rows of one gather_vocab collective: as many as the communicator's capacity takes (>= 1: the
// capacity holds a vocabulary shard, Model::load makes sure).
int64_t gather_rows_per_call(const ModelData& m, const ContextParams& p) {
  return std::clamp<int64_t>((int64_t)m.comm->capacity() / m.vocab_shard, 1, p.n_outputs);
}

BufferSizes buffer_sizes(const ModelData& m, const ContextParams& p) {
  const HParams& hp = m.hp;
  const size_t nb = p.n_batch, q_dim = (size_t)hp.n_heads * hp.head_dim,
               kv_dim = (size_t)hp.n_kv_heads * hp.head_dim;
  const size_t pairs = nb * hp.n_expert_used;  // 0 without experts
  BufferSizes s{nb * hp.dim,
                nb * std::max<size_t>(hp.dim, q_dim),
                nb * q_dim,
                nb * kv_dim,
                nb * kv_dim,
                nb * q_dim,
                nb * hp.max_ffn_dim(),
                nb * hp.max_ffn_dim(),
                nb * hp.dim,
                (size_t)p.n_outputs * hp.dim,
                (size_t)p.n_outputs * hp.n_vocab,
                mm_scratch(m, p),
                cpu::attention_scratch_floats(p.n_ctx, p.n_threads),
                nb * hp.n_expert,
                pairs,
                pairs,
                hp.shexp_ffn_dim > 0 ? nb * hp.dim : 0,
                hp.moe() ? (size_t)hp.n_expert + 1 : 0,
                pairs,
                pairs,
                pairs * hp.dim,
                pairs * hp.expert_ffn_dim,
                pairs * hp.expert_ffn_dim,
                pairs * hp.dim};
  if (m.comm) {
    s.vocab_part = (size_t)p.n_outputs * m.vocab_shard;
    s.vocab_all = (size_t)m.tp_size * gather_rows_per_call(m, p) * m.vocab_shard;
    s.tp_wire = (size_t)tp_rows_words(p.n_batch, p.n_outputs);
  }
  return s;
}

// Per thread: candidates (8 bytes), probabilities and penalty counts (4 each), the distinct list (<= 4).
constexpr size_t kSamplerBytesPerToken = 20;

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const ModelData& m, const ContextParams& params, int n_sample,
                                          bool tp_follower) {
  return std::make_unique<CpuBackend>(m, params, n_sample, tp_follower);
}

Footprint plan_cpu_backend(const ModelData& m, const ContextParams& p) {
  Footprint f;
  f.weights = m.weight_bytes;
  f.kv = kv_cache_bytes(m.hp, p.n_slots, p.n_ctx, p.kv_type, KvMemory::host);
  f.scratch =
      buffer_sizes(m, p).total() * sizeof(float) + (size_t)p.n_threads * m.hp.n_vocab * kSamplerBytesPerToken;
  return f;
}

CpuBackend::CpuBackend(const ModelData& model, const ContextParams& params, int n_sample, bool tp_follower)
    : m_(model),
      p_(params),
      n_sample_(n_sample),
      pool_(p_.n_threads),
      kv_(kv_layout(model.hp, p_.n_slots, p_.n_ctx, p_.kv_type)) {
  const BufferSizes s = buffer_sizes(m_, p_);
  x_ = Buffer<float>(s.x);
  xb_ = Buffer<float>(s.xb);
  q_ = Buffer<float>(s.q);
  k_ = Buffer<float>(s.k);
  v_ = Buffer<float>(s.v);
  att_ = Buffer<float>(s.att);
  hb_ = Buffer<float>(s.hb);
  hb2_ = Buffer<float>(s.hb2);
  acc_ = Buffer<float>(s.acc);
  out_x_ = Buffer<float>(s.out_x);
  logits_ = Buffer<float>(s.logits);
  mm_scratch_ = Buffer<float>(s.mm);
  attn_scratch_ = Buffer<float>(s.attn);
  router_ = Buffer<float>(s.router);
  expert_ids_ = Buffer<int32_t>(s.expert_ids);
  expert_w_ = Buffer<float>(s.expert_w);
  shexp_out_ = Buffer<float>(s.shexp_out);
  moe_start_ = Buffer<int32_t>(s.moe_start);
  moe_row_ = Buffer<int32_t>(s.moe_row);
  moe_pair_ = Buffer<int32_t>(s.moe_pair);
  moe_x_ = Buffer<float>(s.moe_x);
  moe_gate_ = Buffer<float>(s.moe_gate);
  moe_up_ = Buffer<float>(s.moe_up);
  moe_y_ = Buffer<float>(s.moe_y);
  for (int i = 0; i < p_.n_threads; ++i)
    sampler_scratch_.push_back(std::make_unique<SamplerScratch>(m_.hp.n_vocab));
  b_ = {x_.data(),   xb_.data(), q_.data(),   k_.data(),     v_.data(),
        att_.data(), hb_.data(), hb2_.data(), out_x_.data(), logits_.data()};
  b_.router = router_.data();
  b_.expert_ids = expert_ids_.data();
  b_.expert_w = expert_w_.data();
  b_.shexp_out = shexp_out_.data();
  if (m_.comm) {
    comm_ = m_.comm.get();
    vocab_part_ = Buffer<float>(s.vocab_part);
    vocab_all_ = Buffer<float>(s.vocab_all);
    tp_wire_ = Buffer<int32_t>(s.tp_wire);
    b_.vocab_part = vocab_part_.data();
    tp_lead_ = !tp_follower;
    if (tp_lead_) {
      tp_send_create(*comm_, p_, n_sample_);
      ++m_.tp_contexts;
    }
  }
}

CpuBackend::~CpuBackend() {
  if (!tp_lead_) return;
  --m_.tp_contexts;
  tp_send(*comm_, TpCmd::destroy);
}

void CpuBackend::copy_kv(int from, int to, int n) {
  if (tp_lead_) tp_send_copy_kv(*comm_, from, to, n);
  kv_.copy(from, to, n);
}

bool CpuBackend::ranks_in_step() const {
  return !comm_ || (!tp_stopped_ && !comm_->broken());
}

void CpuBackend::poison_kv(int seq, int from) {
  kv_.poison(seq, from);
}

std::string CpuBackend::description() const {
  return fmt::format("CPU ({} kernels{})", cpu::kernel_isa(),
                     cpu::q8_int8_activations() ? "; Q8_0 with int8 activations" : "");
}

Footprint CpuBackend::footprint() const {
  return plan_cpu_backend(m_, p_);
}

void CpuBackend::step(const StepRows& rows, const SampleJob* jobs, int n_jobs, SampleResult* results,
                      TokenLogprob* top, StepStats& stats) {
  auto t0 = std::chrono::steady_clock::now();
  if (tp_lead_) {
    // Once the step is sent the other ranks run its forward, collectives and all: rank 0 stopping on the
    // way leaves them in a collective it will never join (the sampling below runs on rank 0 alone).
    try {
      tp_send_step(*comm_, rows, tp_wire_.data());
      forward(m_.hp, m_, rows, b_, *this);
    } catch (...) {
      tp_stopped_ = true;
      throw;
    }
  } else {
    forward(m_.hp, m_, rows, b_, *this);
  }
  stats.forward_ms += ms_since(t0);
  if (n_jobs == 0) return;

  t0 = std::chrono::steady_clock::now();
  const int V = m_.hp.n_vocab;
  auto run_job = [&](int j, SamplerScratch& s) {
    const SampleJob& job = jobs[j];
    float* logits = logits_.data() + (size_t)job.out * V;
    const bool rules = job.allow || job.params->n_logit_bias > 0;
    const bool bad = rules && apply_logit_rules(*job.params, job.allow, logits, n_sample_);
    results[j] = sample_row(*job.params, logits, n_sample_, {job.window, (size_t)job.n_window}, job.position,
                            s, top + (size_t)j * SamplingParams::kMaxProbs);
    if (rules) results[j].nonfinite = bad;  // -infinity from the rules is not a broken model
  };
  if (n_jobs == 1 || pool_.size() == 1) {
    for (int j = 0; j < n_jobs; ++j) run_job(j, *sampler_scratch_[0]);
  } else {
    std::atomic<int> next{0};
    pool_.parallel([&](int ith, int) {
      for (int j; (j = next.fetch_add(1, std::memory_order_relaxed)) < n_jobs;)
        run_job(j, *sampler_scratch_[ith]);
    });
  }
  stats.sample_ms += ms_since(t0);
}

// ---- ForwardOps ----

// Prefill's row- and element-wise ops go to all threads above these sizes (decode's stay on one: a
// thread-pool round trip costs more than a row).
constexpr int64_t kSplitRows = 16;
constexpr int64_t kSplitElements = (int64_t)1 << 15;

template <class F>
void CpuBackend::split(int64_t n, int64_t min_split, F&& f) {
  if (n < min_split || pool_.size() == 1) return f((int64_t)0, n);
  pool_.parallel([&](int ith, int nth) {
    int64_t b = 0, e = 0;
    ThreadPool::split(n, ith, nth, b, e);
    if (e > b) f(b, e);
  });
}

void CpuBackend::embed(const WeightView& table, const int32_t* tokens, int n, float* x) {
  split(n, kSplitRows, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) cpu::dequant_row(table, tokens[t], x + (size_t)t * table.cols);
  });
}

void CpuBackend::embed_shard(const WeightView& table, int64_t row0, const int32_t* tokens, int n, float* x) {
  split(n, kSplitRows, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t r = (int64_t)tokens[t] - row0;
      float* xt = x + (size_t)t * table.cols;
      if (r >= 0 && r < table.rows)
        cpu::dequant_row(table, r, xt);
      else
        std::fill(xt, xt + table.cols, 0.0f);
    }
  });
}

void CpuBackend::all_reduce_sum(float* x, int64_t n) {
  const int64_t cap = (int64_t)comm_->capacity();
  for (int64_t i = 0; i < n; i += cap) comm_->all_reduce_sum(x + i, (size_t)std::min(cap, n - i));
}

// Rank r's part holds vocabulary columns [r * vs, r * vs + c_r) of every row, c_r rows of its shard (vs, the
// last rank's fewer), rows c_r floats apart. Each collective gathers m rows' worth: m * vs floats from every
// rank (the last rank's tail is whatever follows its rows in its buffer, not read).
void CpuBackend::gather_vocab(const float* part, int n_rows, float* logits) {
  const int size = comm_->size();
  const int64_t V = m_.hp.n_vocab, vs = m_.vocab_shard, mine = m_.output.rows;
  const int64_t per = gather_rows_per_call(m_, p_);
  for (int64_t o0 = 0; o0 < n_rows; o0 += per) {
    const int64_t m = std::min<int64_t>(per, n_rows - o0);
    comm_->all_gather(part + o0 * mine, (size_t)(m * vs), vocab_all_.data());
    for (int r = 0; r < size; ++r) {
      const int64_t c = std::min(V, (r + 1) * vs) - r * vs;
      const float* g = vocab_all_.data() + (size_t)r * m * vs;
      for (int64_t o = 0; o < m; ++o) std::copy(g + o * c, g + (o + 1) * c, logits + (o0 + o) * V + r * vs);
    }
  }
}

void CpuBackend::rmsnorm(const float* x, const float* w, int n_rows, int dim, float eps, float* out) {
  split(n_rows, kSplitRows,
        [&](int64_t b, int64_t e) { cpu::rmsnorm(x + b * dim, w, (int)(e - b), dim, eps, out + b * dim); });
}

void CpuBackend::matmul(MatmulOp /*op*/, const WeightView& w, const float* x, int n, float* y,
                        const float* bias, bool accumulate) {
  if (!accumulate) return cpu::matmul(pool_, w, x, n, y, bias, mm_scratch_.data());
  float* tmp = acc_.data();
  cpu::matmul(pool_, w, x, n, tmp, bias, mm_scratch_.data());
  split((int64_t)n * w.rows, kSplitElements, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) y[i] += tmp[i];
  });
}

void CpuBackend::rope(int il, float* q, int n_heads, float* k, int n_kv_heads, int n, int head_dim,
                      const int32_t* pos, bool interleaved) {
  const float* inv_freq = m_.layer_rope_inv_freq(il, p_.n_ctx).data();
  const std::string& type = m_.hp.rope_scaling.type;
  const float mscale = type == "longrope" || type == "yarn" ? m_.hp.rope_scaling.attention_factor : 1.0f;
  // Per token, a cos and a sin per frequency from libm: a prefill's tokens go to all threads.
  split(n, kSplitRows, [&](int64_t b, int64_t e) {
    cpu::rope(q + b * n_heads * head_dim, (int)(e - b), n_heads, head_dim, pos + b, inv_freq, interleaved,
              mscale);
    cpu::rope(k + b * n_kv_heads * head_dim, (int)(e - b), n_kv_heads, head_dim, pos + b, inv_freq,
              interleaved, mscale);
  });
}

void CpuBackend::kv_write(int il, const float* k, const float* v, int n, const int32_t* pos,
                          const int32_t* seq) {
  const KvLayerView kv = kv_.layer(il);
  const int64_t row = (int64_t)kv.n_kv_heads * kv.head_dim;  // each token writes its own cache rows
  split(n, kSplitRows, [&](int64_t b, int64_t e) {
    cpu::kv_write(kv, k + b * row, v + b * row, (int)(e - b), pos + b, seq + b);
  });
}

void CpuBackend::attention(int il, const float* q, int n, int n_heads, const int32_t* pos, const int32_t* seq,
                           float scale, float softcap, int window, float* out) {
  cpu::attention(pool_, kv_.layer(il), q, n, n_heads, pos, seq, scale, out, attn_scratch_.data(), softcap,
                 window);
}

void CpuBackend::attention_sinks(int il, const float* q, int n, int n_heads, const int32_t* pos,
                                 const int32_t* seq, float scale, int window, const float* sinks,
                                 float* out) {
  cpu::attention(pool_, kv_.layer(il), q, n, n_heads, pos, seq, scale, out, attn_scratch_.data(), 0, window,
                 sinks);
}

void CpuBackend::silu_mul(const float* gate, const float* up, int64_t n, float* out) {
  split(n, kSplitElements, [&](int64_t b, int64_t e) { cpu::silu_mul(gate + b, up + b, e - b, out + b); });
}

void CpuBackend::gelu_mul(const float* gate, const float* up, int64_t n, float* out) {
  split(n, kSplitElements, [&](int64_t b, int64_t e) { cpu::gelu_mul(gate + b, up + b, e - b, out + b); });
}

void CpuBackend::scale(float* x, int64_t n, float s) {
  split(n, kSplitElements, [&](int64_t b, int64_t e) { cpu::scale(x + b, e - b, s); });
}

void CpuBackend::softcap(float* x, int64_t n, float cap) {
  split(n, kSplitElements, [&](int64_t b, int64_t e) { cpu::softcap(x + b, e - b, cap); });
}

void CpuBackend::norm_add(float* x, const float* w, int n_rows, int dim, float eps, float* y) {
  split(n_rows, kSplitRows, [&](int64_t b, int64_t e) {
    // In place: rmsnorm reads a row fully before writing it.
    float* xr = x + b * dim;
    cpu::rmsnorm(xr, w, (int)(e - b), dim, eps, xr);
    float* yr = y + b * dim;
    for (int64_t i = 0; i < (e - b) * dim; ++i) yr[i] += xr[i];
  });
}

void CpuBackend::gather_rows(const float* x, const int32_t* rows, int n_rows, int dim, float* out) {
  for (int r = 0; r < n_rows; ++r) std::copy_n(x + (size_t)rows[r] * dim, dim, out + (size_t)r * dim);
}

void CpuBackend::moe_route(float* logits, int n, int n_expert, int k, bool norm, int32_t* ids, float* w) {
  split(n, kSplitRows, [&](int64_t b, int64_t e) {
    ultra::moe_route(logits + b * n_expert, (int)(e - b), n_expert, k, norm, ids + b * k, w + b * k);
  });
}

void CpuBackend::moe_route_topk_softmax(const float* logits, int n, int n_expert, int k, int32_t* ids,
                                        float* w) {
  split(n, kSplitRows, [&](int64_t b, int64_t e) {
    ultra::moe_route_topk_softmax(logits + b * n_expert, (int)(e - b), n_expert, k, ids + b * k, w + b * k);
  });
}

// Grouped by expert: the n * k (row, expert) pairs sorted by expert (a counting sort, rows ascending within
// an expert), each selected expert's three matmuls over its rows only (one weight read per step, whatever
// the number of rows), then each row's k outputs weighted and summed in slot order (llama.cpp's order) into
// x. Decode (n = 1) reads exactly the k selected experts' weights. gpt-oss: the experts' biases and the
// clamped SwiGLU.
void CpuBackend::moe_ffn(int /*il*/, const LayerWeights& l, const float* xn, int n, const int32_t* ids,
                         const float* w, int k, float* x) {
  const int n_expert = m_.hp.n_expert, dim = m_.hp.dim, ffn = m_.hp.expert_ffn_dim;
  const int n_pairs = n * k;
  int32_t* start = moe_start_.data();  // [n_expert + 1]
  std::fill_n(start, n_expert + 1, 0);
  for (int i = 0; i < n_pairs; ++i) ++start[ids[i] + 1];
  for (int e = 0; e < n_expert; ++e) start[e + 1] += start[e];
  int32_t* pair = moe_pair_.data();
  int32_t* row = moe_row_.data();
  for (int i = 0; i < n_pairs; ++i) {  // start[e] is the next free pair of expert e, then e + 1's start
    const int p = start[ids[i]]++;
    pair[i] = p;
    row[p] = i / k;
  }
  for (int e = n_expert; e > 0; --e) start[e] = start[e - 1];
  start[0] = 0;
  float *xe = moe_x_.data(), *g = moe_gate_.data(), *u = moe_up_.data(), *y = moe_y_.data();
  split(n_pairs, kSplitRows, [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p) std::copy_n(xn + (size_t)row[p] * dim, dim, xe + (size_t)p * dim);
  });
  for (int e = 0; e < n_expert; ++e) {
    const int p0 = start[e], rows = start[e + 1] - p0;
    if (rows == 0) continue;  // an expert no row selected: its weights are not read
    cpu::matmul(pool_, l.gate_exps[e], xe + (size_t)p0 * dim, rows, g + (size_t)p0 * ffn,
                l.gate_exps_b ? l.gate_exps_b + (size_t)e * ffn : nullptr, mm_scratch_.data());
    cpu::matmul(pool_, l.up_exps[e], xe + (size_t)p0 * dim, rows, u + (size_t)p0 * ffn,
                l.up_exps_b ? l.up_exps_b + (size_t)e * ffn : nullptr, mm_scratch_.data());
  }
  if (const float limit = m_.hp.swiglu_limit; limit > 0)
    split((int64_t)n_pairs * ffn, kSplitElements,
          [&](int64_t b, int64_t e) { cpu::swiglu_oai(g + b, u + b, e - b, limit, u + b); });
  else
    silu_mul(g, u, (int64_t)n_pairs * ffn, u);
  for (int e = 0; e < n_expert; ++e) {
    const int p0 = start[e], rows = start[e + 1] - p0;
    if (rows == 0) continue;
    cpu::matmul(pool_, l.down_exps[e], u + (size_t)p0 * ffn, rows, y + (size_t)p0 * dim,
                l.down_exps_b ? l.down_exps_b + (size_t)e * dim : nullptr, mm_scratch_.data());
  }
  split(n, kSplitRows, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      float* xr = x + (size_t)r * dim;
      const int32_t* pr = pair + r * k;
      const float* wr = w + r * k;
      for (int d = 0; d < dim; ++d) {
        float s = wr[0] * y[(size_t)pr[0] * dim + d];
        for (int j = 1; j < k; ++j) s += wr[j] * y[(size_t)pr[j] * dim + d];
        xr[d] += s;
      }
    }
  });
}

void CpuBackend::sigmoid_gate_add(const float* y, const float* gate_w, const float* xn, int n, int dim,
                                  float* x) {
  split(n, kSplitRows, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* xr = xn + r * dim;
      double dot = 0;
      for (int d = 0; d < dim; ++d) dot += (double)gate_w[d] * xr[d];
      const float g = 1.0f / (1.0f + std::exp(-(float)dot));
      for (int d = 0; d < dim; ++d) x[r * dim + d] += g * y[r * dim + d];
    }
  });
}

}  // namespace ultra
