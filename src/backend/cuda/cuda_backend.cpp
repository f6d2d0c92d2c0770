#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_map>

#include "backend/cuda/backend_kernels.h"
#include "backend/cuda/tuning.h"
#include "core/error.h"
#include "kv/layout.h"

namespace ultra {

using cuda::CudaTuning;

static_assert(SamplingParams::kMaxSpeculativeTopK == cuda::kSamplerMaxTopK,
              "Output::propose / verify rows need the sampler's one-pass top_k path");

namespace {

std::atomic<long> g_device_allocs{0};

constexpr size_t kAlign = 256;
size_t align_up(size_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Elements of the BF16 copy a prefill matmul makes of a low-bit matrix (0 for other types).
int64_t lowbit_bf16_elems(const WeightView& w) {
  return cuda::is_lowbit(w.type) ? w.rows * cuda::lowbit_bf16_ld(w.cols) : 0;
}

// Bytes the device layout of a low-bit matrix adds to the file's (rows padded to 16 bytes; 0 for others).
size_t lowbit_padding(const WeightView& w) {
  if (!cuda::is_lowbit(w.type) || !w.data) return 0;
  const size_t dev = cuda::lowbit_row_bytes(w.type, w.cols) * (size_t)w.rows;
  const size_t host = w.row_bytes * (size_t)w.rows;
  return dev > host ? dev - host : 0;
}

std::string mib(size_t b) {
  return fmt::format("{:.1f} MiB", b / 1048576.0);
}

// The settings that are process-wide switches of the kernels (tuning.h: launch mode, gemv choice), applied
// where the environment set them; they stay set after this backend.
void apply_process_tuning(const cuda::CudaTuning& t) {
  if (t.pdl >= 0) {
    cuda::set_programmatic_launch(t.pdl > 0);
    if (t.pdl > 0) cuda::set_programmatic_launch_level(t.pdl);
  }
  if (t.gemv_set) cuda::tuning::set_gemv_tuning(t.gemv);
  if (t.gemv_l2 >= 0) cuda::tuning::set_gemv_l2_all(t.gemv_l2 != 0);
  if (t.gemv_l1 >= 0) cuda::tuning::set_gemv_l1_all(t.gemv_l1 != 0);
}

// This backend's attention plans' tuning: the process-wide values (tuning.h) where the environment set none.
cuda::AttentionTuning attention_tuning(const cuda::CudaTuning& t) {
  cuda::AttentionTuning a = cuda::process_attention_tuning();
  if (t.attention_rows) a.tiled = 1;
  if (t.attention_pdl >= 0) a.pdl = t.attention_pdl != 0;
  if (t.attn_min_chunk >= 0) a.min_chunk = cuda::attention_min_chunk(t.attn_min_chunk);
  if (t.attn_combine_pdl >= 0) a.combine_pdl = t.attn_combine_pdl != 0;
  if (t.attn_trigger >= 0) a.trigger = t.attn_trigger;
  return a;
}

}  // namespace

// ---- DeviceAllocator ----

DeviceAllocator::~DeviceAllocator() {
  for (void* p : ptrs_) cudaFree(p);
}

void* DeviceAllocator::alloc(size_t bytes, const char* what) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, align_up(std::max<size_t>(bytes, 1)));
  ++g_device_allocs;
  if (e != cudaSuccess) {
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    fail("CUDA: cannot allocate {} for {} ({}; {} of {} free)", mib(bytes), what, cudaGetErrorString(e),
         mib(free_b), mib(total_b));
  }
  ptrs_.push_back(p);
  bytes_ += align_up(bytes);
  return p;
}

long DeviceAllocator::total_calls() {
  return g_device_allocs.load();
}

std::unique_ptr<Backend> make_cuda_backend(const ModelData& m, const ContextParams& params, int n_sample) {
  return std::make_unique<CudaBackend>(m, params, n_sample);
}

// ---- CudaBackend ----

void CudaBackend::check(cudaError_t e, const char* what) const {
  if (e != cudaSuccess) fail("CUDA: {} failed: {}", what, cudaGetErrorString(e));
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
  check(cuda::query_device(0, &dev_), "device query");

  n_rows_cap_ = p_.n_batch;
  int largest_bucket = 0;
  for (int b : kBuckets)
    if (b <= n_rows_cap_) largest_bucket = b;
  n_out_cap_ = std::max(p_.n_outputs, largest_bucket);
  max_hist_ = std::min(SamplingParams::kMaxHistory, p_.n_ctx);

  // Sizes first: refuse before allocating anything when the device cannot hold the context.
  const size_t q_dim = (size_t)hp.n_heads * hp.head_dim, kv_dim = (size_t)hp.n_kv_heads * hp.head_dim;
  const size_t nb = n_rows_cap_;
  const KvLayout kv_shape = kv_layout(hp, p_.n_slots, p_.n_ctx, p_.kv_type);
  kv_bytes_ = kv_cache_bytes(kv_shape, KvMemory::device);
  const KvLayerView proto = kv_shape.view(nullptr, nullptr);
  apply_process_tuning(tune_);
  if (!tune_.skip_list.empty())
    fmt::print(stderr,
               "ULTRA_CUDA_SKIP={}: these ops are left out of every step (timing only; results are wrong)\n",
               tune_.skip_list);
  const cuda::AttentionTuning attn = attention_tuning(tune_);
  eager_plan_ = cuda::plan_attention(dev_, proto, hp.n_heads, n_rows_cap_, 0, attn);
  size_t attn_ws = eager_plan_.workspace_bytes;
  for (size_t i = 0; i < kBuckets.size(); ++i) {
    if (kBuckets[i] > n_rows_cap_) continue;
    bucket_plans_[i] = cuda::plan_attention(dev_, proto, hp.n_heads, kBuckets[i], 0, attn);
    attn_ws = std::max(attn_ws, bucket_plans_[i].workspace_bytes);
  }
  check(cuda::plan_sampler(dev_, n_out_cap_, hp.n_vocab, max_hist_, &sampler_plan_),
        "sampler plan (the vocabulary may be too large for one block's shared memory)");
  // Prefill matmuls of low-bit matrices dequantise them to BF16 into the matmul workspace: room for the
  // largest one (rows x cols rounded up to 8).
  int64_t max_lowbit = 0;
  for (const WeightView* w : {&m_.output}) max_lowbit = std::max(max_lowbit, lowbit_bf16_elems(*w));
  for (const LayerWeights& l : m_.layers)
    for (const WeightView* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down, &l.ffn_gate_inp,
                                &l.w_gate_shexp, &l.w_up_shexp, &l.w_down_shexp})
      max_lowbit = std::max(max_lowbit, lowbit_bf16_elems(*w));
  const size_t ffn = hp.max_ffn_dim();  // the dense FFN's or the shared expert's
  const size_t mm_ws = cuda::CudaMatmul::workspace_bytes(
      n_rows_cap_, std::max<int64_t>({hp.dim, (int64_t)q_dim, (int64_t)ffn}), max_lowbit);
  // Mixture of experts: router logits, the choice and its weights, the shared expert's output, moe_ffn's
  // scratch.
  const size_t n_moe = hp.moe() ? nb : 0, k_used = hp.n_expert_used;
  const size_t moe_ws = hp.moe() ? cuda::moe_scratch_bytes(n_rows_cap_, hp.n_expert_used, hp.n_expert,
                                                           hp.expert_ffn_dim, hp.dim)
                                 : 0;
  const size_t act =
      sizeof(float) * (nb * hp.dim * 2 + nb * std::max<size_t>(hp.dim, q_dim) + nb * q_dim * 2 +
                       nb * kv_dim * 2 + nb * ffn * 2 + (size_t)n_out_cap_ * hp.dim +
                       (size_t)n_out_cap_ * hp.n_vocab + q_dim + 2 * kv_dim + 2 * ffn) +
      n_moe * (hp.n_expert * sizeof(float) + k_used * (sizeof(int32_t) + sizeof(float)) +
               (hp.shexp_ffn_dim ? hp.dim * sizeof(float) : 0)) +
      moe_ws;
  const size_t ring_bytes = (size_t)p_.n_slots * kProposalRing * sizeof(cuda::SpecDist);
  scratch_bytes_ = act + mm_ws + attn_ws + sampler_plan_.workspace_bytes +
                   (size_t)p_.n_slots * p_.n_ctx * sizeof(int32_t) + ring_bytes;
  size_t free_b = 0, total_b = 0;
  check(cudaMemGetInfo(&free_b, &total_b), "memory query");
  weight_bytes_ = m_.weight_bytes + lowbit_padding(m_.output) +
                  (m_.tok_embd.data != m_.output.data ? lowbit_padding(m_.tok_embd) : 0);
  for (const LayerWeights& l : m_.layers)
    for (const WeightView* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down})
      weight_bytes_ += lowbit_padding(*w);
  const size_t need = weight_bytes_ + kv_bytes_ + scratch_bytes_;
  if (need > free_b)
    fail(
        "CUDA backend: the context needs {} (weights {}, KV cache {}, scratch {}) but the device has {} free "
        "of "
        "{}; lower -c or the number of slots",
        mib(need), mib(weight_bytes_), mib(kv_bytes_), mib(scratch_bytes_), mib(free_b), mib(total_b));

  check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "stream creation");
  upload_weights();

  // KV cache (kv/layout.h): one K and one V buffer per layer, [n_slots, n_kv_heads, n_ctx, head_dim], zeroed.
  const size_t kv_layer = kv_shape.buffer_bytes();
  kv_ = kv_allocate(kv_shape, [&](size_t bytes) { return mem_.alloc(bytes, "KV cache"); });
  for (const KvLayerView& v : kv_) {
    check(cudaMemsetAsync(v.k, 0, kv_layer, stream_), "KV clear");
    check(cudaMemsetAsync(v.v, 0, kv_layer, stream_), "KV clear");
  }

  // Activations.
  auto f = [&](size_t n, const char* what) { return mem_.alloc_n<float>(n, what); };
  b_.x = f(nb * hp.dim, "activations");
  b_.xb = f(nb * std::max<size_t>(hp.dim, q_dim), "activations");
  b_.q = f(nb * q_dim, "activations");
  b_.k = f(nb * kv_dim, "activations");
  b_.v = f(nb * kv_dim, "activations");
  b_.att = f(nb * q_dim, "activations");
  b_.hb = f(nb * ffn, "activations");
  b_.hb2 = f(nb * ffn, "activations");
  b_.out_x = f((size_t)n_out_cap_ * hp.dim, "activations");
  b_.logits = f((size_t)n_out_cap_ * hp.n_vocab, "logits");
  qkv1_ = f(q_dim + 2 * kv_dim, "activations");
  gu1_ = f(2 * ffn, "activations");
  if (hp.moe()) {
    b_.router = f(nb * hp.n_expert, "router logits");
    b_.expert_ids = mem_.alloc_n<int32_t>(nb * k_used, "expert choice");
    b_.expert_w = f(nb * k_used, "expert weights");
    if (hp.shexp_ffn_dim) b_.shexp_out = f(nb * hp.dim, "shared expert");
    moe_s_ = cuda::moe_scratch(mem_.alloc(moe_ws, "expert scratch"), n_rows_cap_, hp.n_expert_used,
                               hp.n_expert, hp.expert_ffn_dim, hp.dim);
  }
  token_log_ = mem_.alloc_n<int32_t>((size_t)p_.n_slots * p_.n_ctx, "token log");
  d_link_ = mem_.alloc_n<cuda::LinkedTokens>(1, "linked tokens");
  proposals_ = mem_.alloc_n<cuda::SpecDist>((size_t)p_.n_slots * kProposalRing, "kept proposals");
  check(cudaMemsetAsync(d_link_, 0, sizeof(cuda::LinkedTokens), stream_), "clear");
  check(cudaMemsetAsync(token_log_, 0, (size_t)p_.n_slots * p_.n_ctx * sizeof(int32_t), stream_), "clear");

  void* mm_mem = mem_.alloc(mm_ws, "matmul workspace");
  check(mm_.init(mm_mem, mm_ws), "cuBLASLt init");
  if (attn_ws) attn_ws_ = mem_.alloc(attn_ws, "attention workspace");
  sampler_ws_ = mem_.alloc(sampler_plan_.workspace_bytes, "sampler workspace");
  check(cuda::sampler_workspace_init(sampler_plan_, sampler_ws_, stream_), "sampler workspace init");

  // Step IO: pinned host blocks and their device mirrors.
  size_t o = 0;
  auto put = [&](size_t bytes) {
    const size_t at = o;
    o = align_up(o + bytes);
    return at;
  };
  lay_.tok = put(nb * 4);
  lay_.feed = put(nb * sizeof(TokenFeed));
  lay_.pos = put(nb * 4);
  lay_.seq = put(nb * 4);
  lay_.out_row = put((size_t)n_out_cap_ * 4);
  lay_.srow = put((size_t)n_out_cap_ * sizeof(cuda::SamplerRow));
  lay_.in_bytes = o;
  o = 0;
  lay_.token = put((size_t)n_out_cap_ * 4);
  lay_.logprob = put((size_t)n_out_cap_ * 4);
  lay_.top_token = put((size_t)n_out_cap_ * cuda::kSamplerMaxProbs * 4);
  lay_.top_logprob = put((size_t)n_out_cap_ * cuda::kSamplerMaxProbs * 4);
  lay_.error = put((size_t)n_out_cap_ * 4);
  lay_.out_bytes = o;
  for (int i = 0; i < kInFlight; ++i) {
    check(cudaMallocHost((void**)&h_in_[i], lay_.in_bytes), "pinned host allocation");
    check(cudaMallocHost((void**)&h_out_[i], lay_.out_bytes), "pinned host allocation");
    std::memset(h_in_[i], 0, lay_.in_bytes);
    check(cudaEventCreateWithFlags(&done_ev_[i], cudaEventDisableTiming), "event creation");
  }
  check(cudaMallocHost((void**)&h_logits_, (size_t)n_out_cap_ * hp.n_vocab * sizeof(float)),
        "pinned host allocation");
  d_in_ = static_cast<uint8_t*>(mem_.alloc(lay_.in_bytes, "step inputs"));
  d_out_ = static_cast<uint8_t*>(mem_.alloc(lay_.out_bytes, "step results"));
  logits_ready_.assign(n_out_cap_, 0);
  if (tune_.profile) {
    prof_.on = true;
    prof_.ev.resize(2 * kMaxOps);
    prof_.name.resize(kMaxOps);
    for (cudaEvent_t& ev : prof_.ev) check(cudaEventCreate(&ev), "event creation");
  }
  if (p_.gpu_timing)
    for (auto& pair : gap_ev_)
      for (cudaEvent_t& ev : pair) check(cudaEventCreate(&ev), "event creation");
  check(cudaStreamSynchronize(stream_), "initialisation");
}

CudaBackend::~CudaBackend() {
  if (stream_) cudaStreamSynchronize(stream_);
  if (prof_.on) {
    print_profile();
    for (cudaEvent_t ev : prof_.ev) cudaEventDestroy(ev);
  }
  for (auto& pair : gap_ev_)
    for (cudaEvent_t ev : pair)
      if (ev) cudaEventDestroy(ev);
  for (auto& set : graphs_)
    for (cudaGraphExec_t g : set)
      if (g) cudaGraphExecDestroy(g);
  for (int i = 0; i < kInFlight; ++i) {
    if (h_in_[i]) cudaFreeHost(h_in_[i]);
    if (h_out_[i]) cudaFreeHost(h_out_[i]);
    if (done_ev_[i]) cudaEventDestroy(done_ev_[i]);
  }
  if (h_logits_) cudaFreeHost(h_logits_);
  if (stream_) cudaStreamDestroy(stream_);
}

// Weights: every matrix in its own type (F32 / F16 / BF16; Q8_0 / F8_E4M3 / TERNARY and the GGUF block types
// Q4_0 .. Q5_1, Q4_K .. Q6_K repacked on the host into the device layout of gemv_lowbit.h, their f32 scales
// copied as they are), norms and biases as f32, in one allocation; a matrix used twice (tied embeddings) is
// uploaded once. Each layer's Wq, Wk, Wv are placed back to back, as are W_gate and W_up, and the biases bq,
// bk, bv (zeros for a missing one): one view then covers the fused matrix [Wq; Wk; Wv] or [W_gate; W_up] for
// the single-row step, while the separate views (row ranges of it) serve the others. No weight is stored
// twice.
void CudaBackend::upload_weights() {
  const HParams& hp = m_.hp;
  struct Part {
    const void* src;  // null: zeros
    size_t bytes;
    const WeightView* lowbit = nullptr;  // src is this low-bit matrix: repacked row by row (device layout)
    int64_t repeat = 1;                  // bytes / repeat at src, written repeat times (a scale per tensor
                                         // made one per row for a fused view)
  };
  std::vector<std::vector<Part>> blocks;
  std::unordered_map<const void*, bool> seen;
  std::vector<Part> scale_parts;                // the F8_E4M3 / TERNARY scale arrays, each its own block
  std::vector<std::vector<Part>> scale_groups;  // those of a fused F8_E4M3 / TERNARY matrix: one block
  // Moves the scale parts of the fused matrices ws (the last ones given to mat) into one block, in row order,
  // a scale per tensor repeated once per row: the fused view's scales, one per row.
  auto group_scales = [&](std::initializer_list<const WeightView*> ws) {
    if (!(*ws.begin())->scale || scale_parts.size() < ws.size()) return;
    std::vector<Part> g(scale_parts.end() - (long)ws.size(), scale_parts.end());
    scale_parts.resize(scale_parts.size() - ws.size());
    size_t i = 0;
    for (const WeightView* w : ws) {
      if (w->scale_row_stride == 0) g[i].repeat = w->rows, g[i].bytes *= (size_t)w->rows;
      ++i;
    }
    scale_groups.push_back(g);
  };
  auto mat = [&](const WeightView& w) -> Part {
    if (cuda::is_lowbit(w.type)) {
      const size_t rb = cuda::lowbit_row_bytes(w.type, w.cols);
      if (!rb)
        fail("CUDA backend: a {} matrix of {} columns has no device layout", type_name(w.type), w.cols);
      if (const int64_t ns = cuda::lowbit_scale_count(w); ns > 0) {
        if (!w.scale) fail("CUDA backend: a {} matrix without scales", type_name(w.type));
        scale_parts.push_back({w.scale, (size_t)ns * sizeof(float)});
      }
      return {w.data, rb * (size_t)w.rows, &w};
    }
    if (w.type != GgmlType::F32 && w.type != GgmlType::F16 && w.type != GgmlType::BF16)
      fail(
          "CUDA backend: {} weights are not supported (use F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, "
          "Q4_K, "
          "Q5_K, Q6_K, F8_E4M3 or TERNARY weights, or the CPU backend)",
          type_name(w.type));
    return {w.data, w.row_bytes * (size_t)w.rows};
  };
  auto add = [&](std::vector<Part> parts) {
    std::vector<Part> keep;
    for (const Part& p : parts)
      if (!p.src || seen.emplace(p.src, true).second) keep.push_back(p);
    if (!keep.empty()) blocks.push_back(keep);
  };
  // Matrices that can share one view: same type, columns and row size, 16-byte rows. Of the low-bit types
  // Q8_0 and the GGUF block types (gemv_kquant.h), whose scales are inside their device rows, and F8_E4M3 /
  // TERNARY with one scale per row or tensor, whose scale arrays are then placed back to back as one per row
  // (one block, below): one launch for [Wq; Wk; Wv] and [W_gate; W_up].
  auto fusable = [&](std::initializer_list<const WeightView*> ws) {
    const WeightView& a = **ws.begin();
    if (cuda::is_lowbit(a.type)) {
      for (const WeightView* w : ws)
        if (w->cols != a.cols || w->type != a.type ||
            (a.type != GgmlType::Q8_0 && !cuda::is_kquant(a.type) &&
             !cuda::lowbit_scale_per_row_or_tensor(*w)))
          return false;
      return true;
    }
    for (const WeightView* w : ws)
      if (w->type != a.type || w->cols != a.cols || w->row_bytes != a.row_bytes || w->row_bytes % 16)
        return false;
    return true;
  };
  add({mat(m_.tok_embd)});
  add({mat(m_.output)});
  const size_t q_dim = (size_t)hp.n_heads * hp.head_dim, kv_dim = (size_t)hp.n_kv_heads * hp.head_dim;
  std::vector<bool> fuse_qkv, fuse_gu;
  for (const LayerWeights& l : m_.layers) {
    fuse_qkv.push_back(fusable({&l.wq, &l.wk, &l.wv}));
    fuse_gu.push_back(fusable({&l.w_gate, &l.w_up}));
    if (fuse_qkv.back()) {
      add({mat(l.wq), mat(l.wk), mat(l.wv)});
      if (cuda::lowbit_scale_count(l.wq) > 0) group_scales({&l.wq, &l.wk, &l.wv});
    } else {
      add({mat(l.wq)});
      add({mat(l.wk)});
      add({mat(l.wv)});
    }
    add({mat(l.wo)});
    if (fuse_gu.back()) {
      add({mat(l.w_gate), mat(l.w_up)});
      if (cuda::lowbit_scale_count(l.w_gate) > 0) group_scales({&l.w_gate, &l.w_up});
    } else {
      add({mat(l.w_gate)});
      add({mat(l.w_up)});
    }
    add({mat(l.w_down)});
    if (hp.moe()) {  // the router, each kind's experts back to back (one block: moe.h), the shared expert
      add({mat(l.ffn_gate_inp)});
      for (const WeightView* ex : {l.gate_exps, l.up_exps, l.down_exps}) {
        std::vector<Part> parts;
        for (int e = 0; e < hp.n_expert; ++e) {
          if (ex[e].type != GgmlType::F32 && ex[e].type != GgmlType::F16 && ex[e].type != GgmlType::BF16 &&
              ex[e].type != GgmlType::Q8_0)
            fail(
                "CUDA backend: {} expert weights are not supported (use F32, F16, BF16 or Q8_0 experts, or "
                "the CPU backend)",
                type_name(ex[e].type));
          parts.push_back(mat(ex[e]));
        }
        add(parts);
      }
      if (hp.shexp_ffn_dim) {
        add({mat(l.w_gate_shexp)});
        add({mat(l.w_up_shexp)});
        add({mat(l.w_down_shexp)});
        add({{l.ffn_gate_inp_shexp, hp.dim * sizeof(float)}});
      }
    }
    add({{l.attn_norm, hp.dim * sizeof(float)}});
    add({{l.ffn_norm, hp.dim * sizeof(float)}});
    if (l.attn_post_norm) add({{l.attn_post_norm, hp.dim * sizeof(float)}});
    if (l.ffn_post_norm) add({{l.ffn_post_norm, hp.dim * sizeof(float)}});
    if (l.bq || l.bk || l.bv)
      add({{l.bq, q_dim * sizeof(float)}, {l.bk, kv_dim * sizeof(float)}, {l.bv, kv_dim * sizeof(float)}});
    if (l.q_norm) add({{l.q_norm, hp.head_dim * sizeof(float)}, {l.k_norm, hp.head_dim * sizeof(float)}});
  }
  add({{m_.output_norm, hp.dim * sizeof(float)}});
  add({{m_.rope_inv_freq.data(), hp.head_dim / 2 * sizeof(float)}});
  for (const std::vector<float>* t : {&m_.rope_inv_freq_swa, &m_.rope_inv_freq_long})
    if (!t->empty()) add({{t->data(), hp.head_dim / 2 * sizeof(float)}});
  for (const Part& p : scale_parts) add({p});
  for (const std::vector<Part>& g : scale_groups) add(g);

  size_t total = 0;
  for (const auto& b : blocks) {
    for (const Part& p : b) total += p.bytes;
    total = align_up(total);
  }
  uint8_t* base = static_cast<uint8_t*>(mem_.alloc(total, "weights"));
  std::unordered_map<const void*, uint8_t*> dev;  // host data -> its device copy
  size_t at = 0;
  const auto t0 = std::chrono::steady_clock::now();
  double last_report_ms = -1;  // none yet
  std::vector<uint8_t> stage;  // low-bit rows in the device layout, up to 64 MiB at a time
  for (const auto& b : blocks) {
    for (const Part& p : b) {
      if (p.lowbit) {
        const WeightView& w = *p.lowbit;
        const size_t rb = cuda::lowbit_row_bytes(w.type, w.cols);
        const int64_t step = std::max<int64_t>(1, (int64_t)((size_t(64) << 20) / rb));
        stage.resize((size_t)std::min<int64_t>(step, w.rows) * rb);
        for (int64_t r0 = 0; r0 < w.rows; r0 += step) {
          const int64_t r1 = std::min(w.rows, r0 + step);
          if (!cuda::lowbit_pack_rows(w, r0, r1, stage.data()))
            fail("CUDA backend: cannot repack a {} matrix [{}, {}]", type_name(w.type), w.rows, w.cols);
          check(cudaMemcpy(base + at + (size_t)r0 * rb, stage.data(), (size_t)(r1 - r0) * rb,
                           cudaMemcpyHostToDevice),
                "weight upload");
        }
        dev[p.src] = base + at;
      } else if (p.src && p.repeat > 1) {
        const size_t one = p.bytes / (size_t)p.repeat;
        stage.resize(p.bytes);
        for (int64_t i = 0; i < p.repeat; ++i) std::memcpy(stage.data() + (size_t)i * one, p.src, one);
        check(cudaMemcpy(base + at, stage.data(), p.bytes, cudaMemcpyHostToDevice), "weight upload");
        dev[p.src] = base + at;
      } else if (p.src) {
        check(cudaMemcpy(base + at, p.src, p.bytes, cudaMemcpyHostToDevice), "weight upload");
        dev[p.src] = base + at;
      } else {
        check(cudaMemset(base + at, 0, p.bytes), "weight upload");
      }
      at += p.bytes;
      const double ms = ms_since(t0);
      if (p_.upload_progress && ms > 1000 && ms - last_report_ms >= 100) {
        p_.upload_progress(std::min(at, total), total);
        last_report_ms = ms;
      }
    }
    at = align_up(at);
  }
  if (p_.upload_progress && last_report_ms >= 0) p_.upload_progress(total, total);

  auto dev_mat = [&](const WeightView& w) {
    WeightView d = w;
    if (!w.data) return d;  // an empty matrix (a mixture-of-experts layer's dense FFN)
    d.data = dev.at(w.data);
    if (cuda::is_lowbit(w.type)) {  // device layout; the scales' device copy
      d.row_bytes = cuda::lowbit_row_bytes(w.type, w.cols);
      d.scale = w.scale ? reinterpret_cast<const float*>(dev.at(w.scale)) : nullptr;
    }
    return d;
  };
  auto dev_vec = [&](const float* p) { return p ? reinterpret_cast<const float*>(dev.at(p)) : nullptr; };
  w_.tok_embd = dev_mat(m_.tok_embd);
  w_.output = dev_mat(m_.output);
  w_.output_norm = dev_vec(m_.output_norm);
  for (int il = 0; il < hp.n_layers; ++il)  // the sliding-window layers' own, longrope's long factors, ...
    layer_inv_freq_.push_back(dev_vec(m_.layer_rope_inv_freq(il, p_.n_ctx).data()));
  rope_mscale_ = hp.rope_scaling.type == "longrope" ? hp.rope_scaling.attention_factor : 1.0f;
  exp_views_.reserve(3 * m_.layers.size());
  for (size_t il = 0; il < m_.layers.size(); ++il) {
    const LayerWeights& l = m_.layers[il];
    LayerWeights d = l;
    d.wq = dev_mat(l.wq);
    d.wk = dev_mat(l.wk);
    d.wv = dev_mat(l.wv);
    d.wo = dev_mat(l.wo);
    d.w_gate = dev_mat(l.w_gate);
    d.w_up = dev_mat(l.w_up);
    d.w_down = dev_mat(l.w_down);
    d.attn_norm = dev_vec(l.attn_norm);
    d.ffn_norm = dev_vec(l.ffn_norm);
    d.attn_post_norm = dev_vec(l.attn_post_norm);
    d.ffn_post_norm = dev_vec(l.ffn_post_norm);
    d.bq = dev_vec(l.bq);
    d.bk = dev_vec(l.bk);
    d.bv = dev_vec(l.bv);
    d.q_norm = dev_vec(l.q_norm);
    d.k_norm = dev_vec(l.k_norm);
    if (hp.moe()) {
      d.ffn_gate_inp = dev_mat(l.ffn_gate_inp);
      d.w_gate_shexp = dev_mat(l.w_gate_shexp);
      d.w_up_shexp = dev_mat(l.w_up_shexp);
      d.w_down_shexp = dev_mat(l.w_down_shexp);
      d.ffn_gate_inp_shexp = dev_vec(l.ffn_gate_inp_shexp);
      MoeLayer ml;
      cuda::ExpertWeights* kinds[3] = {&ml.gate, &ml.up, &ml.down};
      const WeightView* host[3] = {l.gate_exps, l.up_exps, l.down_exps};
      const WeightView** dev_arr[3] = {&d.gate_exps, &d.up_exps, &d.down_exps};
      for (int kind = 0; kind < 3; ++kind) {
        std::vector<WeightView>& views = exp_views_.emplace_back();
        for (int e = 0; e < hp.n_expert; ++e) views.push_back(dev_mat(host[kind][e]));
        *dev_arr[kind] = views.data();
        cuda::ExpertWeights& x = *kinds[kind];
        x.type = views[0].type;
        x.data = views[0].data;
        x.rows = views[0].rows;
        x.cols = views[0].cols;
        x.row_bytes = views[0].row_bytes;
        x.expert_bytes = x.row_bytes * (size_t)x.rows;
        x.n_expert = hp.n_expert;
        for (int e = 0; e < hp.n_expert; ++e)  // placed back to back by the block above
          if (views[e].data != static_cast<const uint8_t*>(x.data) + (size_t)e * x.expert_bytes ||
              views[e].type != x.type || views[e].rows != x.rows || views[e].cols != x.cols)
            fail("CUDA backend: layer {}'s experts are not alike (expert {})", il, e);
        if (!cuda::moe_weights_ok(x))
          fail(
              "CUDA backend: layer {}'s {} experts [{}, {}] have no CUDA kernel (columns must be a multiple "
              "of 8)",
              il, type_name(x.type), x.rows, x.cols);
      }
      ml.router.type = d.ffn_gate_inp.type;
      ml.router.data = d.ffn_gate_inp.data;
      ml.router.rows = d.ffn_gate_inp.rows;
      ml.router.cols = d.ffn_gate_inp.cols;
      ml.router.row_bytes = d.ffn_gate_inp.row_bytes;
      ml.router.expert_bytes = ml.router.row_bytes * (size_t)ml.router.rows;
      ml.router.n_expert = 1;
      if (!cuda::moe_weights_ok(ml.router)) ml.router.data = nullptr;
      moe_.push_back(ml);
    }
    w_.layers.push_back(d);
    Fused f;
    if (fuse_qkv[il]) {
      f.qkv = d.wq;
      f.qkv.rows = l.wq.rows + l.wk.rows + l.wv.rows;
      if (f.qkv.scale) f.qkv.scale_row_stride = 1, f.qkv.scale_group = f.qkv.cols;  // one per row (above)
      // The bias block starts at bq when it exists, else at the zeros placed for it.
      if (l.bq || l.bk || l.bv) f.qkv_bias = l.bq ? d.bq : l.bk ? d.bk - q_dim : d.bv - q_dim - kv_dim;
    }
    if (fuse_gu[il]) {
      f.gate_up = d.w_gate;
      f.gate_up.rows = l.w_gate.rows + l.w_up.rows;
      if (f.gate_up.scale) f.gate_up.scale_row_stride = 1, f.gate_up.scale_group = f.gate_up.cols;
    }
    fused_.push_back(f);
  }
}

void CudaBackend::poison_kv(int seq, int from) {
  for (const KvLayerView& v : kv_)
    kv_poison(v, seq, from, [&](uint8_t* p, size_t n) {
      check(cudaMemsetAsync(p, kKvPoisonByte, n, stream_), "KV poison");
    });
  check(cudaStreamSynchronize(stream_), "KV poison");
}

void CudaBackend::copy_kv(int from, int to, int n) {
  if (n <= 0) return;
  for (const KvLayerView& v : kv_)
    kv_copy(v, from, to, n, [&](uint8_t* dst, const uint8_t* src, size_t width, size_t height, size_t pitch) {
      check(cudaMemcpy2DAsync(dst, pitch, src, pitch, width, height, cudaMemcpyDeviceToDevice, stream_),
            "KV copy");
    });
  check(cudaMemcpyAsync(token_log_ + (size_t)to * p_.n_ctx, token_log_ + (size_t)from * p_.n_ctx,
                        (size_t)n * sizeof(int32_t), cudaMemcpyDeviceToDevice, stream_),
        "KV copy");
}

Footprint CudaBackend::footprint() const {
  Footprint f;
  f.weights = weight_bytes_;
  f.kv = kv_bytes_;
  f.scratch = scratch_bytes_ + (1 + kInFlight) * (lay_.in_bytes + lay_.out_bytes);
  return f;
}

int CudaBackend::n_graphs() const {
  int n = 0;
  for (const auto& set : graphs_)
    for (cudaGraphExec_t g : set) n += g != nullptr;
  return n;
}

void CudaBackend::enqueue(int n, int n_out, bool sample, const cuda::AttentionPlan& plan, const uint8_t* h_in,
                          uint8_t* h_out) {
  prof_begin("input upload");
  check(cuda::copy_kernel(d_in_, h_in, lay_.in_bytes, stream_), "input upload");
  prof_end();
  int32_t* tok = reinterpret_cast<int32_t*>(d_in_ + lay_.tok);
  const TokenFeed* feed = reinterpret_cast<const TokenFeed*>(d_in_ + lay_.feed);
  const int32_t* pos = reinterpret_cast<const int32_t*>(d_in_ + lay_.pos);
  const int32_t* seq = reinterpret_cast<const int32_t*>(d_in_ + lay_.seq);
  prof_begin("token log");
  // The previous step's sampled tokens are still in d_out_: this step's sampler writes it later.
  check(cuda::token_log_write(token_log_, p_.n_ctx, p_.n_slots, tok, feed, pos, seq,
                              reinterpret_cast<const int32_t*>(d_out_ + lay_.token), d_link_, n, stream_),
        "token log");
  prof_end();
  StepRows rows;
  rows.n = n;
  rows.token = tok;
  rows.pos = pos;
  rows.seq = seq;
  rows.n_out = n_out;
  rows.out_row = reinterpret_cast<const int32_t*>(d_in_ + lay_.out_row);
  cur_plan_ = &plan;
  forward(m_.hp, w_, rows, b_, *this);
  if (sample && n_out > 0) {
    cuda::SamplerOutputs out;
    out.token = reinterpret_cast<int32_t*>(d_out_ + lay_.token);
    out.logprob = reinterpret_cast<float*>(d_out_ + lay_.logprob);
    out.top_token = reinterpret_cast<int32_t*>(d_out_ + lay_.top_token);
    out.top_logprob = reinterpret_cast<float*>(d_out_ + lay_.top_logprob);
    out.error = reinterpret_cast<int32_t*>(d_out_ + lay_.error);
    check(cuda::sample(sampler_plan_, b_.logits, m_.hp.n_vocab, n_sample_,
                       reinterpret_cast<const cuda::SamplerRow*>(d_in_ + lay_.srow), n_out, out, sampler_ws_,
                       stream_),
          "sampler");
    check(cuda::copy_kernel(h_out, d_out_, lay_.out_bytes, stream_), "result download");
  }
}

bool CudaBackend::link(const LinkSource& source) {
  link_ = dynamic_cast<CudaBackend*>(source.backend);
  if (link_ && link_->dev_.device != dev_.device) link_ = nullptr;  // another device: fed through the host
  cuda::LinkedTokens d;
  if (link_) {
    d.log = link_->token_log_;
    d.out = reinterpret_cast<const int32_t*>(link_->d_out_ + link_->lay_.token);
    d.n_ctx = link_->p_.n_ctx;
    d.n_slots = link_->p_.n_slots;
  }
  check(cudaMemcpyAsync(d_link_, &d, sizeof d, cudaMemcpyHostToDevice, stream_), "link");
  check(cudaStreamSynchronize(stream_), "link");
  return link_ != nullptr;
}

void CudaBackend::step(const StepRows& rows, const SampleJob* jobs, int n_jobs, SampleResult* results,
                       TokenLogprob* top, StepStats& stats) {
  submit(rows, jobs, n_jobs, results, top, stats);
  complete(stats);
}

void CudaBackend::submit(const StepRows& rows, const SampleJob* jobs, int n_jobs, SampleResult* results,
                         TokenLogprob* top, StepStats& stats) {
  if (n_out_q_ >= kInFlight) fail("CUDA backend: {} steps are outstanding already", kInFlight);
  const auto t0 = std::chrono::steady_clock::now();
  const int n = rows.n;
  // The blocks of step i - kInFlight are free again: the engine completed it before submitting this one.
  const int par = (int)(n_submitted_ % kInFlight);
  uint8_t* h_in = h_in_[par];
  uint8_t* h_out = h_out_[par];
  // The graph slot of this step: the smallest row bucket that holds it (its outputs padded to the bucket),
  // or, for a full prefill chunk of n_batch rows, the prefill slot (outputs padded to n_out_cap); else none.
  int bi = -1, n_eff = n, n_out_eff = rows.n_out;
  const cuda::AttentionPlan* plan = &eager_plan_;
  for (size_t i = 0; i < kBuckets.size() && bi < 0; ++i)
    if (kBuckets[i] >= n && kBuckets[i] <= n_rows_cap_) {
      bi = (int)i;
      n_eff = n_out_eff = kBuckets[i];
      plan = &bucket_plans_[i];
    }
  if (bi < 0 && n == n_rows_cap_) {
    bi = kPrefillSlot;
    n_out_eff = std::min(n_out_cap_, n);
  }

  // Stage the rows (padding rows: sequence -1) and one sampler row per output.
  int32_t* tok = reinterpret_cast<int32_t*>(h_in + lay_.tok);
  TokenFeed* feed = reinterpret_cast<TokenFeed*>(h_in + lay_.feed);
  int32_t* pos = reinterpret_cast<int32_t*>(h_in + lay_.pos);
  int32_t* seq = reinterpret_cast<int32_t*>(h_in + lay_.seq);
  int32_t* out_row = reinterpret_cast<int32_t*>(h_in + lay_.out_row);
  cuda::SamplerRow* srow = reinterpret_cast<cuda::SamplerRow*>(h_in + lay_.srow);
  for (int i = 0; i < n_eff; ++i) {
    const bool real = i < n;
    tok[i] = real ? rows.token[i] : 0;
    feed[i] = real && rows.feed ? rows.feed[i] : TokenFeed::id;
    pos[i] = real ? rows.pos[i] : 0;
    seq[i] = real ? rows.seq[i] : -1;
  }
  for (int k = 0; k < n_out_eff; ++k) {
    out_row[k] = k < rows.n_out ? rows.out_row[k] : -1;
    srow[k] = {};
    srow[k].logits_row = -1;
  }
  for (int j = 0; j < n_jobs; ++j) {
    const SampleJob& job = jobs[j];
    const SamplingParams& sp = *job.params;
    const int r = rows.out_row[job.out];
    cuda::SamplerRow& s = srow[job.out];
    s.temperature = sp.temperature;
    s.top_k = sp.top_k;
    s.top_p = sp.top_p;
    s.min_p = sp.min_p;
    s.repeat_penalty = sp.repeat_penalty;
    s.presence_penalty = sp.presence_penalty;
    s.frequency_penalty = sp.frequency_penalty;
    s.n_probs = sp.n_probs;
    s.seed = sp.seed;
    s.position = job.position;
    // The window ends at the row's own token, in the device copy of the sequence's tokens.
    s.n_hist = std::min(job.n_window, max_hist_);
    s.hist = token_log_ + (int64_t)rows.seq[r] * p_.n_ctx + (rows.pos[r] + 1 - s.n_hist);
    s.logits_row = job.out;
    s.propose = nullptr;
    s.x = nullptr;
    s.q = nullptr;
    const size_t entry = (size_t)(job.position % kProposalRing);
    if (job.kind == Output::propose) s.propose = proposals_ + (size_t)rows.seq[r] * kProposalRing + entry;
    if (job.kind == Output::verify) {
      s.x = token_log_ + (int64_t)rows.seq[r] * p_.n_ctx + job.position;
      if (job.q_src >= 0) {
        if (!link_) fail("CUDA backend: row {} verifies a linked backend's proposal, but none is linked", r);
        s.q = link_->proposals_ + (size_t)job.q_src * kProposalRing + entry;
      }
    }
  }
  std::fill(logits_ready_.begin(), logits_ready_.end(), 0);

  // Tokens read from the linked backend: this stream waits (on the device) for its last submitted step.
  for (int i = 0; i < n && rows.feed; ++i) {
    if (rows.feed[i] != TokenFeed::linked_seq && rows.feed[i] != TokenFeed::linked_output) continue;
    if (!link_) fail("CUDA backend: row {} reads a linked backend's token, but none is linked", i);
    if (link_->n_submitted_ > 0)
      check(cudaStreamWaitEvent(stream_, link_->done_ev_[(link_->n_submitted_ - 1) % kInFlight], 0),
            "wait for the linked backend");
    break;
  }

  if (prof_.on) bi = -1;  // every step runs directly, op by op
  prof_.recording = prof_.on && n == 1;
  prof_.n_ops = 0;
  const cudaGraphExec_t graph = bi >= 0 ? graphs_[par][bi] : nullptr;
  const bool replay = graph != nullptr;
  const int64_t index = n_submitted_;
  if (replay) {
    if (p_.gpu_timing) check(cudaEventRecord(gap_ev_[index % 3][0], stream_), "timing event");
    const auto tl = std::chrono::steady_clock::now();
    check(cudaGraphLaunch(graph, stream_), "graph launch");
    last_launch_us_ = ms_since(tl) * 1e3;
    ++n_graph_launches_;
    launch_us_ += last_launch_us_;
    if (p_.gpu_timing) check(cudaEventRecord(gap_ev_[index % 3][1], stream_), "timing event");
  } else {
    enqueue(n_eff, n_out_eff, bi >= 0 || n_jobs > 0, *plan, h_in, h_out);
    if (bi >= 0) {
      // The bucket's first step ran directly (modules loaded, cuBLASLt heuristics cached): capture it, for
      // both sets of pinned blocks at once (a capture runs nothing), so that no later step runs directly.
      check(cudaStreamSynchronize(stream_), "step");
      for (int q = 0; q < kInFlight; ++q) {
        if (graphs_[q][bi]) continue;
        cudaGraph_t graph = nullptr;
        check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "graph capture");
        try {
          enqueue(n_eff, n_out_eff, true, *plan, h_in_[q], h_out_[q]);
        } catch (...) {
          cudaStreamEndCapture(stream_, &graph);
          if (graph) cudaGraphDestroy(graph);
          throw;
        }
        check(cudaStreamEndCapture(stream_, &graph), "graph capture");
        size_t n_nodes = 0;
        cudaGraphGetNodes(graph, nullptr, &n_nodes);
        graph_nodes_[bi] = (int)n_nodes;
        const cudaError_t e = cudaGraphInstantiate(&graphs_[q][bi], graph, 0);
        cudaGraphDestroy(graph);
        check(e, "graph instantiation");
        check(cudaGraphUpload(graphs_[q][bi], stream_), "graph upload");  // its first launch is not slower
      }
    }
  }
  check(cudaEventRecord(done_ev_[par], stream_), "step event");
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
  check(cudaEventSynchronize(done_ev_[o.parity]), "step");
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
  if (prof_.recording && prof_.n_ops > 0) {
    for (int i = 0; i < prof_.n_ops; ++i) {
      float ms = 0;
      cudaEventElapsedTime(&ms, prof_.ev[2 * i], prof_.ev[2 * i + 1]);
      size_t k = 0;
      while (k < prof_.total_us.size() && std::strcmp(prof_.total_us[k].first, prof_.name[i]) != 0) ++k;
      if (k == prof_.total_us.size()) {  // the first steps allocate the table; profiling only
        prof_.total_us.push_back({prof_.name[i], 0.0});
        prof_.calls.push_back(0);
      }
      prof_.total_us[k].second += 1e3 * ms;
      ++prof_.calls[k];
    }
    float ms = 0;
    cudaEventElapsedTime(&ms, prof_.ev[0], prof_.ev[2 * prof_.n_ops - 1]);
    prof_.gpu_us += 1e3 * ms;
    prof_.wall_us += 1e3 * std::chrono::duration<double, std::milli>(now - o.t0).count();
    ++prof_.steps;
  }

  const uint8_t* h_out = h_out_[o.parity];
  const SampleJob* jobs = o.jobs;
  SampleResult* results = o.results;
  TokenLogprob* top = o.top;
  const int n_jobs = o.n_jobs;
  const int32_t* r_tok = reinterpret_cast<const int32_t*>(h_out + lay_.token);
  const float* r_lp = reinterpret_cast<const float*>(h_out + lay_.logprob);
  const int32_t* r_ttok = reinterpret_cast<const int32_t*>(h_out + lay_.top_token);
  const float* r_tlp = reinterpret_cast<const float*>(h_out + lay_.top_logprob);
  const int32_t* r_err = reinterpret_cast<const int32_t*>(h_out + lay_.error);
  for (int j = 0; j < n_jobs; ++j) {
    const int k = jobs[j].out;
    SampleResult& r = results[j];
    r.token = r_tok[k];
    r.logprob = r_lp[k];
    r.nonfinite = r_err[k] != 0;
    r.n_top = 0;
    const int want = std::min(jobs[j].params->n_probs, cuda::kSamplerMaxProbs);
    for (int i = 0; i < want && r_ttok[k * cuda::kSamplerMaxProbs + i] >= 0; ++i) {
      top[(size_t)j * SamplingParams::kMaxProbs + i] = {r_ttok[k * cuda::kSamplerMaxProbs + i],
                                                        r_tlp[k * cuda::kSamplerMaxProbs + i]};
      r.n_top = i + 1;
    }
  }
}

const float* CudaBackend::logits(int k) {
  const size_t V = m_.hp.n_vocab;
  float* dst = h_logits_ + (size_t)k * V;
  if (!logits_ready_[k]) {
    check(cudaMemcpyAsync(dst, b_.logits + (size_t)k * V, V * sizeof(float), cudaMemcpyDeviceToHost, stream_),
          "logits download");
    check(cudaStreamSynchronize(stream_), "logits download");
    logits_ready_[k] = 1;
  }
  return dst;
}

// ---- ForwardOps: the kernels of kernels.h on the backend's stream ----

void CudaBackend::embed(const WeightView& table, const int32_t* tokens, int n, float* x) {
  prof_begin("embed");
  check(cuda::embed(table, tokens, n, x, stream_), "embed");
  prof_end();
}
void CudaBackend::rmsnorm(const float* x, const float* w, int n_rows, int dim, float eps, float* out) {
  if (tune_.skip & CudaTuning::kSkipRmsnorm) return;
  prof_begin("rmsnorm");
  check(cuda::rmsnorm(x, w, n_rows, dim, eps, out, stream_), "rmsnorm");
  prof_end();
}
void CudaBackend::matmul(const WeightView& w, const float* x, int n, float* y, const float* bias,
                         bool accumulate) {
  if (tune_.skip) {
    const HParams& hp = m_.hp;
    const int64_t q = (int64_t)hp.n_heads * hp.head_dim, kv = (int64_t)hp.n_kv_heads * hp.head_dim;
    const unsigned bit = w.rows == hp.n_vocab                                ? CudaTuning::kSkipLmHead
                         : (w.rows == q || w.rows == kv) && w.cols == hp.dim ? CudaTuning::kSkipQkv
                         : w.cols == q                                       ? CudaTuning::kSkipO
                         : w.rows == hp.ffn_dim                              ? CudaTuning::kSkipGateUp
                         : w.cols == hp.ffn_dim                              ? CudaTuning::kSkipDown
                                                                             : 0u;
    if (tune_.skip & bit) return;
  }
  if (prof_.recording) {  // name the matrix by its shape
    const HParams& hp = m_.hp;
    const int64_t q = (int64_t)hp.n_heads * hp.head_dim, kv = (int64_t)hp.n_kv_heads * hp.head_dim;
    prof_begin(w.rows == hp.n_vocab              ? "matmul lm_head"
               : w.rows == q && w.cols == hp.dim ? "matmul q"
               : w.rows == kv                    ? "matmul k, v"
               : w.cols == q                     ? "matmul o (+ residual)"
               : w.rows == hp.ffn_dim            ? "matmul gate, up"
               : w.cols == hp.ffn_dim            ? "matmul down (+ residual)"
                                                 : "matmul other");
  }
  check(mm_.matmul(w, x, n, y, bias, accumulate, stream_), "matmul");
  prof_end();
}
const float* CudaBackend::layer_inv_freq(int il) const {
  return layer_inv_freq_[il];
}
void CudaBackend::rope(int il, float* q, int n_heads, float* k, int n_kv_heads, int n, int head_dim,
                       const int32_t* pos, bool interleaved) {
  if (tune_.skip & CudaTuning::kSkipRope) return;
  prof_begin("rope");
  check(cuda::rope(q, n_heads, k, n_kv_heads, n, head_dim, pos, layer_inv_freq(il), interleaved, stream_,
                   rope_mscale_),
        "rope");
  prof_end();
}
void CudaBackend::kv_write(int il, const float* k, const float* v, int n, const int32_t* pos,
                           const int32_t* seq) {
  if (tune_.skip & CudaTuning::kSkipRope) return;
  prof_begin("kv_write");
  check(cuda::kv_write(kv_[il], k, v, n, pos, seq, stream_), "kv_write");
  prof_end();
}
void CudaBackend::attention(int il, const float* q, int n, int n_heads, const int32_t* pos,
                            const int32_t* seq, float scale, float softcap, int window, float* out) {
  if (tune_.skip & CudaTuning::kSkipAttention) return;
  prof_begin("attention");
  check(cuda::attention(*cur_plan_, kv_[il], q, n, pos, seq, scale, out, attn_ws_, stream_, softcap, window),
        "attention");
  prof_end();
}
void CudaBackend::gelu_mul(const float* gate, const float* up, int64_t n, float* out) {
  prof_begin("gelu_mul");
  check(cuda::gelu_mul(gate, up, n, out, stream_), "gelu_mul");
  prof_end();
}
void CudaBackend::scale(float* x, int64_t n, float s) {
  prof_begin("scale");
  check(cuda::scale(x, n, s, stream_), "scale");
  prof_end();
}
void CudaBackend::softcap(float* x, int64_t n, float cap) {
  prof_begin("softcap");
  check(cuda::softcap(x, n, cap, stream_), "softcap");
  prof_end();
}
// x += rmsnorm(y) * w (y is scratch: normed in place).
void CudaBackend::norm_add(float* y, const float* w, int n_rows, int dim, float eps, float* x) {
  prof_begin("rmsnorm + add");
  check(cuda::rmsnorm(y, w, n_rows, dim, eps, y, stream_), "rmsnorm");
  check(cuda::add(x, y, (int64_t)n_rows * dim, stream_), "add");
  prof_end();
}
void CudaBackend::qkv(int il, const LayerWeights& l, const float* x, int n, float*& q, float*& k, float*& v) {
  const Fused& f = fused_[il];
  if (n != 1 || !f.qkv.data) return ForwardOps::qkv(il, l, x, n, q, k, v);
  if (tune_.skip & CudaTuning::kSkipQkv) return;
  prof_begin("matmul qkv (fused)");
  check(mm_.matmul(f.qkv, x, 1, qkv1_, f.qkv_bias, false, stream_), "matmul");
  prof_end();
  q = qkv1_;
  k = q + l.wq.rows;
  v = k + l.wk.rows;
}
void CudaBackend::gate_up(int il, const LayerWeights& l, const float* x, int n, float*& gate, float*& up) {
  const Fused& f = fused_[il];
  if (n != 1 || !f.gate_up.data) return ForwardOps::gate_up(il, l, x, n, gate, up);
  if (tune_.skip & CudaTuning::kSkipGateUp) return;
  prof_begin("matmul gate_up (fused)");
  check(mm_.matmul(f.gate_up, x, 1, gu1_, nullptr, false, stream_), "matmul");
  prof_end();
  gate = gu1_;
  up = gu1_ + l.w_gate.rows;
}
void CudaBackend::silu_mul(const float* gate, const float* up, int64_t n, float* out) {
  if (tune_.skip & CudaTuning::kSkipSilu) return;
  prof_begin("silu_mul");
  check(cuda::silu_mul(gate, up, n, out, stream_), "silu_mul");
  prof_end();
}
void CudaBackend::rope_kv_write(int il, float* q, int n_heads, float* k, const float* v, int n_kv_heads,
                                int n, int head_dim, const int32_t* pos, const int32_t* seq,
                                bool interleaved) {
  if (tune_.skip & CudaTuning::kSkipRope) return;
  if (!(tune_.fuse & 1))
    return ForwardOps::rope_kv_write(il, q, n_heads, k, v, n_kv_heads, n, head_dim, pos, seq, interleaved);
  prof_begin("rope + kv_write");
  check(cuda::rope_kv_write(q, n_heads, k, v, kv_[il], n, pos, seq, layer_inv_freq(il), interleaved, stream_,
                            rope_mscale_),
        "rope_kv_write");
  prof_end();
}
void CudaBackend::moe_router(int il, const LayerWeights& l, const float* xn, int n, float* logits) {
  // The matmul is f32 up to kLowbitGemvMaxRows rows (the gemv, and the low-bit gemv), and fast there.
  const cuda::ExpertWeights& r = moe_[il].router;
  if (!r.data || n <= cuda::kLowbitGemvMaxRows) return ForwardOps::moe_router(il, l, xn, n, logits);
  prof_begin("moe router");
  check(cuda::moe_router(r, xn, n, logits, stream_), "moe_router");
  prof_end();
}
void CudaBackend::moe_route(float* logits, int n, int n_expert, int k, bool norm, int32_t* ids, float* w) {
  prof_begin("moe route");
  check(cuda::moe_route(logits, n, n_expert, k, norm, ids, w, stream_, &moe_s_), "moe_route");
  prof_end();
}
void CudaBackend::moe_ffn(int il, const LayerWeights& /*l*/, const float* xn, int n, const int32_t* ids,
                          const float* w, int k, float* x) {
  const MoeLayer& e = moe_[il];
  prof_begin("moe experts");
  // forward() routes just before (moe_route): a one-row step's tiles are made.
  check(cuda::moe_ffn(e.gate, e.up, e.down, xn, n, ids, w, k, x, moe_s_, stream_, n == 1), "moe_ffn");
  prof_end();
}
void CudaBackend::sigmoid_gate_add(const float* y, const float* gate_w, const float* xn, int n, int dim,
                                   float* x) {
  prof_begin("shared expert gate");
  check(cuda::sigmoid_gate_add(y, gate_w, xn, n, dim, x, stream_), "sigmoid_gate_add");
  prof_end();
}

bool CudaBackend::fused(cudaError_t e, const char* what) {
  if (e == cudaErrorNotSupported || e == cudaErrorInvalidValue) {  // nothing launched
    cudaGetLastError();
    return false;
  }
  check(e, what);
  return true;
}
bool CudaBackend::norm_qkv(int il, const LayerWeights& l, const float* x, int n, float eps, float*& q,
                           float*& k, float*& v) {
  const Fused& f = fused_[il];
  if (!(tune_.fuse & 4) || tune_.skip || n != 1 || !f.qkv.data) return false;
  prof_begin("rmsnorm + matmul qkv (fused)");
  const bool ok =
      fused(cuda::gemv_rmsnorm(f.qkv, x, nullptr, l.attn_norm, eps, qkv1_, f.qkv_bias, false, stream_),
            "gemv_rmsnorm");
  prof_end();
  if (!ok) return false;
  q = qkv1_;
  k = q + l.wq.rows;
  v = k + l.wk.rows;
  return true;
}
bool CudaBackend::norm_gate_up(int il, const LayerWeights& l, const float* x, int n, float eps, float*& gate,
                               float*& up) {
  const Fused& f = fused_[il];
  if (!(tune_.fuse & 4) || tune_.skip || n != 1 || !f.gate_up.data) return false;
  prof_begin("rmsnorm + matmul gate_up (fused)");
  const bool ok =
      fused(cuda::gemv_rmsnorm(f.gate_up, x, nullptr, l.ffn_norm, eps, gu1_, nullptr, false, stream_),
            "gemv_rmsnorm");
  prof_end();
  if (!ok) return false;
  gate = gu1_;
  up = gu1_ + l.w_gate.rows;
  return true;
}
bool CudaBackend::norm_matmul1(const WeightView& w, const float* norm_w, const float* x, const int32_t* row,
                               float eps, float* y) {
  if (!(tune_.fuse & 16) || tune_.skip) return false;
  prof_begin("gather + rmsnorm + matmul lm_head (fused)");
  const bool ok =
      fused(cuda::gemv_rmsnorm(w, x, row, norm_w, eps, y, nullptr, false, stream_), "gemv_rmsnorm");
  prof_end();
  return ok;
}
bool CudaBackend::silu_matmul(const WeightView& w, const float* gate, const float* up, int n, float* y,
                              bool accumulate) {
  if ((tune_.fuse & 8) && !tune_.skip && n == 1) {
    prof_begin("silu_mul + matmul down (+ residual, fused)");
    const bool ok = fused(cuda::gemv_swiglu(w, gate, up, y, accumulate, stream_), "gemv_swiglu");
    prof_end();
    if (ok) return true;
  }
  return false;
}
void CudaBackend::gather_rows(const float* x, const int32_t* rows, int n_rows, int dim, float* out) {
  prof_begin("gather_rows");
  check(cuda::gather_rows(x, rows, n_rows, dim, out, stream_), "gather_rows");
  prof_end();
}

// ---- profiling (ULTRA_CUDA_PROFILE) ----

void CudaBackend::prof_begin(const char* op) {
  if (!prof_.recording || prof_.n_ops >= kMaxOps) return;
  prof_.name[prof_.n_ops] = op;
  cudaEventRecord(prof_.ev[2 * prof_.n_ops], stream_);
}

void CudaBackend::prof_end() {
  if (!prof_.recording || prof_.n_ops >= kMaxOps) return;
  cudaEventRecord(prof_.ev[2 * prof_.n_ops + 1], stream_);
  ++prof_.n_ops;
}

void CudaBackend::print_profile() const {
  if (prof_.steps == 0) return;
  const double n = prof_.steps;
  fmt::print(stderr, "\nCUDA profile: {} single-row steps, run op by op (no graph), events around every op\n",
             prof_.steps);
  fmt::print(stderr, "{:<26} {:>10} {:>12} {:>8}\n", "op", "calls/step", "us/step", "share");
  double sum = 0;
  for (const auto& t : prof_.total_us) sum += t.second;
  for (size_t k = 0; k < prof_.total_us.size(); ++k)
    fmt::print(stderr, "{:<26} {:>10.1f} {:>12.1f} {:>7.1f}%\n", prof_.total_us[k].first, prof_.calls[k] / n,
               prof_.total_us[k].second / n, 100 * prof_.total_us[k].second / sum);
  fmt::print(stderr, "{:<26} {:>10} {:>12.1f}\n", "sum of ops", "", sum / n);
  fmt::print(stderr, "{:<26} {:>10} {:>12.1f}   (first op start to last op end: gaps between ops included)\n",
             "GPU time per step", "", prof_.gpu_us / n);
  fmt::print(stderr, "{:<26} {:>10} {:>12.1f}   (host: staging, launches, synchronisation, results)\n",
             "wall time per step", "", prof_.wall_us / n);
}

}  // namespace ultra
