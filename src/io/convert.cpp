#include "io/convert.h"

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <unordered_set>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/error.h"
#include "core/lowbit.h"
#include "core/quantize_blocks.h"
#include "core/thread_pool.h"
#include "io/gguf.h"
#include "io/imatrix.h"
#include "io/quant_mix.h"
#include "io/safetensors.h"
#include "model/lowbit_weights.h"
#include "model/model.h"
#include "model/tensor_names.h"
#include "tokenizer/gguf_export.h"

namespace ultra {

GgmlType parse_out_type(const std::string& s) {
  std::string l = s;
  std::transform(l.begin(), l.end(), l.begin(), ::tolower);
  if (l == "f32") return GgmlType::F32;
  if (l == "f16") return GgmlType::F16;
  if (l == "bf16") return GgmlType::BF16;
  if (l == "q8_0") return GgmlType::Q8_0;
  if (l == "fp8" || l == "f8_e4m3") return GgmlType::F8_E4M3;
  if (l == "ternary") return GgmlType::TERNARY;
  if (l == "tq1_0") return GgmlType::TQ1_0;
  if (l == "tq2_0") return GgmlType::TQ2_0;
  fail("unknown output type '{}' (choose f32, f16, bf16, q8_0, fp8, ternary, tq1_0 or tq2_0)", s);
}

namespace {

// llama.cpp's LLAMA_FTYPE values for general.file_type
uint32_t file_type(GgmlType t) {
  switch (t) {
    case GgmlType::F32:
      return 0;
    case GgmlType::F16:
      return 1;
    case GgmlType::Q8_0:
      return 7;
    case GgmlType::BF16:
      return 32;
    case GgmlType::TQ1_0:
      return 36;
    case GgmlType::TQ2_0:
      return 37;
    case GgmlType::F8_E4M3:  // no llama.cpp file type: ultra's type id (docs/QUANTIZATION.md)
    case GgmlType::TERNARY:
      return (uint32_t)t;
    default:
      return 0;
  }
}

// Row r of w as f32.
void row_f32(const WeightView& w, int64_t r, float* out) {
  cpu::dequant_row(w, r, out);
}

// The source row of output row r of a matrix: r itself, or with permute (Q/K in GGUF arch "llama") HF's
// rotate-half row (h, a, j) for interleaved row (h, j, a), a in {0, 1}, j < head_dim/2 (llama.cpp's permute).
struct RowOrder {
  bool permute;
  int64_t hd;  // head_dim
  int64_t operator()(int64_t r) const {
    if (!permute) return r;
    const int64_t h = r / hd, i = r % hd, j = i / 2, a = i % 2;
    return h * hd + a * (hd / 2) + j;
  }
};

// Where row r of a matrix being written comes from: a RowMap gives its row in the one input view
// (row_src(r)); ExpertRows reads HF's per-expert matrices as the stacked [n_expert * rows, cols] matrix
// llama.cpp stores.
struct ExpertRows {
  const WeightView* views;  // [n_expert], each [rows, cols]
  int64_t rows;
};
template <class RowMap>
void source_row(const WeightView& w, const RowMap& row_src, int64_t r, float* out) {
  row_f32(w, row_src(r), out);
}
inline void source_row(const WeightView&, const ExpertRows& e, int64_t r, float* out) {
  row_f32(e.views[r / e.rows], r % e.rows, out);
}

// The types convert / quantize write row by row without core/quantize_blocks (and read as input).
bool is_plain_convert_type(GgmlType t) {
  switch (t) {
    case GgmlType::F32:
    case GgmlType::F16:
    case GgmlType::BF16:
    case GgmlType::Q8_0:
    case GgmlType::F8_E4M3:
    case GgmlType::TERNARY:
    case GgmlType::TQ1_0:
    case GgmlType::TQ2_0:
      return true;
    default:
      return false;
  }
}

bool all_finite(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i])) return false;
  return true;
}

// The type a matrix of `cols` columns is written in when `t` cannot hold its rows (llama.cpp's quantize
// falls back the same way); t itself when it can.
GgmlType fallback_type(GgmlType t, int64_t cols) {
  const auto tt = type_traits(t);
  if (cols % tt->block_elems == 0) return t;
  return cols % kQ8_0Block == 0 ? GgmlType::Q8_0 : GgmlType::F16;
}

// Adds tensors to the writer as producers: each matrix is converted when write() reaches it, so only one
// converted tensor is in memory at a time. Every produced tensor reports progress.
// llama.cpp's stacked experts (blk.N.ffn_{gate,up,down}_exps.weight, ggml shape {cols, rows, n_expert}):
// quantized as the one matrix [n_expert * rows, cols] their rows form, and written back 3-D.
bool stacked_experts(const gguf::TensorInfo& ti) {
  return ti.ne.size() == 3 && ti.ne[1] * ti.ne[2] > 0 && ti.name.find("_exps.") != std::string::npos;
}
WeightView stacked_experts_view(const gguf::TensorInfo& ti) {
  WeightView w;
  w.type = ti.type;
  w.data = ti.data;
  w.cols = (int64_t)ti.ne[0];
  w.rows = (int64_t)(ti.ne[1] * ti.ne[2]);
  w.row_bytes = ti.n_bytes / (uint64_t)w.rows;
  return w;
}

struct Emitter {
  gguf::Writer& wr;
  std::function<void(const std::string&)> done;
  std::function<void(const std::string&)> warn;
  bool ternary_per_row = false;
  ThreadPool* pool = nullptr;  // when set, the rows of a matrix are converted on its threads
  int count = 0;

  // A matrix [rows, cols] in type t; row_src(r) gives the source row index (for the Q/K permutation).
  // F8_E4M3 and TERNARY add their F32 scale tensor "<base>.scale" (core/views.h). imatrix: nullptr or
  // [cols] importance weights for the block types of core/quantize_blocks.h (kept alive by the caller until
  // the writer is done). shape: the ggml shape written (llama.cpp's stacked experts {cols, rows, n_expert},
  // w then their [n_expert * rows, cols]); empty: {cols, rows}.
  template <class RowMap>
  void matrix(const std::string& name, const WeightView& w, GgmlType t, RowMap row_src,
              const float* imatrix = nullptr, std::vector<uint64_t> shape = {}) {
    if (const GgmlType f = fallback_type(t, w.cols); f != t) {
      if (warn)
        warn(fmt::format("{}: {} columns are not a multiple of {}; written as {} instead of {}", name, w.cols,
                         type_traits(t)->block_elems, type_name(f), type_name(t)));
      t = f;
    }
    // Scales of the scaled types, computed once (by whichever producer runs first): [rows] or [1].
    auto scales = std::make_shared<std::vector<float>>();
    const bool per_tensor = t == GgmlType::TERNARY && !ternary_per_row;
    auto get_scales = [w, t, row_src, scales, per_tensor]() -> const std::vector<float>& {
      if (!scales->empty()) return *scales;
      std::vector<float> row(w.cols);
      double sum_all = 0;
      for (int64_t r = 0; r < w.rows; ++r) {
        source_row(w, row_src, r, row.data());
        if (t == GgmlType::F8_E4M3) {
          scales->push_back(fp8_row_scale(row.data(), w.cols));
        } else {
          double sum = 0;
          for (float v : row) sum += std::fabs(v);
          sum_all += sum;
          if (!per_tensor) scales->push_back(ternary_scale(sum, w.cols));
        }
      }
      if (per_tensor) scales->push_back(ternary_scale(sum_all, w.rows * w.cols));
      return *scales;
    };
    ++count;
    if (!is_plain_convert_type(t) && !can_quantize_blocks(t))
      fail("{}: unsupported output type {}", name, type_name(t));
    if (shape.empty()) shape = {(uint64_t)w.cols, (uint64_t)w.rows};
    if (shape.size() > 2 && has_scale_tensor(t))
      fail("{}: the experts cannot be written as {} (its scale tensor is per 2-D matrix)", name,
           type_name(t));
    wr.add_tensor(name, t, shape, [this, name, w, t, row_src, get_scales, per_tensor, imatrix](uint8_t* dst) {
      const size_t rb = row_bytes(*type_traits(t), w.cols);
      const std::vector<float>* sc = has_scale_tensor(t) ? &get_scales() : nullptr;
      // rows [r0, r1) into dst
      std::atomic<int64_t> bad_row{-1};  // a row with a NaN / Inf value (block types)
      auto rows = [&](int64_t r0, int64_t r1) {
        std::vector<float> row(w.cols);
        for (int64_t r = r0; r < r1; ++r) {
          source_row(w, row_src, r, row.data());
          uint8_t* d = dst + rb * r;
          switch (t) {
            case GgmlType::F32:
              std::memcpy(d, row.data(), rb);
              break;
            case GgmlType::F16:
              for (int64_t c = 0; c < w.cols; ++c) {
                const uint16_t h = fp32_to_fp16(row[c]);
                std::memcpy(d + 2 * c, &h, 2);
              }
              break;
            case GgmlType::BF16:
              for (int64_t c = 0; c < w.cols; ++c) {
                const uint16_t h = fp32_to_bf16(row[c]);
                std::memcpy(d + 2 * c, &h, 2);
              }
              break;
            case GgmlType::Q8_0:
              cpu::quantize_row_q8_0(row.data(), w.cols, reinterpret_cast<BlockQ8_0*>(d));
              break;
            case GgmlType::F8_E4M3:
              quantize_row_fp8(row.data(), w.cols, (*sc)[r], d);
              break;
            case GgmlType::TERNARY:
              quantize_row_ternary(row.data(), w.cols, (*sc)[per_tensor ? 0 : r],
                                   reinterpret_cast<uint32_t*>(d));
              break;
            case GgmlType::TQ1_0:
              quantize_row_tq1_0(row.data(), w.cols, reinterpret_cast<BlockTQ1_0*>(d));
              break;
            case GgmlType::TQ2_0:
              quantize_row_tq2_0(row.data(), w.cols, reinterpret_cast<BlockTQ2_0*>(d));
              break;
            default:  // checked above
              // (no throw on a pool thread: a non-finite row is reported after the rows)
              if (!all_finite(row.data(), w.cols)) {
                int64_t none = -1;
                bad_row.compare_exchange_strong(none, r);
                continue;
              }
              quantize_row(t, row.data(), w.cols, d, imatrix);
          }
        }
      };
      if (pool && pool->size() > 1 && w.rows >= 2 * pool->size()) {
        pool->parallel([&](int ith, int nth) {
          int64_t r0, r1;
          ThreadPool::split(w.rows, ith, nth, r0, r1);
          rows(r0, r1);
        });
      } else {
        rows(0, w.rows);
      }
      if (bad_row.load() >= 0)
        fail("tensor '{}': row {} holds a non-finite value (NaN or Inf); refusing to quantize it", name,
             bad_row.load());
      done(name);
    });
    if (has_scale_tensor(t)) {
      const std::string sn = scale_tensor_name(name);
      ++count;
      wr.add_tensor(sn, GgmlType::F32, {(uint64_t)(per_tensor ? 1 : w.rows)},
                    [this, sn, get_scales](uint8_t* dst) {
                      const std::vector<float>& sc = get_scales();
                      std::memcpy(dst, sc.data(), 4 * sc.size());
                      done(sn);
                    });
    }
  }

  // A tensor copied as it is (bytes stay in the mapped input until written).
  void copy(const gguf::TensorInfo& t) {
    ++count;
    const std::string name = t.name;
    const uint8_t* src = t.data;
    const uint64_t n = t.n_bytes;
    wr.add_tensor(t.name, t.type, t.ne, [this, name, src, n](uint8_t* dst) {
      std::memcpy(dst, src, n);
      done(name);
    });
  }

  // An F32 vector of n values; shape: the ggml shape written (empty: {n}).
  void vec(const std::string& name, const float* v, int64_t n, std::vector<uint64_t> shape = {}) {
    ++count;
    std::vector<float> copy(v, v + n);
    if (shape.empty()) shape = {(uint64_t)n};
    wr.add_tensor(name, GgmlType::F32, shape, [this, name, copy](uint8_t* dst) {
      std::memcpy(dst, copy.data(), 4 * copy.size());
      done(name);
    });
  }

  // Stacked experts written in their own type, byte for byte (gpt-oss's MXFP4 experts, which llama.cpp's
  // converter keeps MXFP4 too): views [n_expert] of [rows, cols] each, ggml shape {cols, rows, n_expert}.
  void raw_experts(const std::string& name, const WeightView* views, int n_expert) {
    ++count;
    const WeightView w0 = views[0];
    const size_t bytes = (size_t)w0.row_bytes * w0.rows;
    std::vector<const void*> src;
    for (int e = 0; e < n_expert; ++e) src.push_back(views[e].data);
    wr.add_tensor(name, w0.type, {(uint64_t)w0.cols, (uint64_t)w0.rows, (uint64_t)n_expert},
                  [this, name, src, bytes](uint8_t* dst) {
                    for (size_t e = 0; e < src.size(); ++e) std::memcpy(dst + e * bytes, src[e], bytes);
                    done(name);
                  });
  }
};

// Refuses an output that is one of the inputs (the same device and inode: the path itself, a hard link,
// or a symlink to it), which the final rename would replace.
void check_not_an_input(const std::string& out, const std::vector<std::string>& inputs) {
  struct stat o {};
  if (::stat(out.c_str(), &o) != 0) return;  // does not exist yet
  for (const std::string& in : inputs) {
    struct stat i {};
    if (::stat(in.c_str(), &i) == 0 && i.st_dev == o.st_dev && i.st_ino == o.st_ino)
      fail("{}: the output is the input file {}; refusing to overwrite it", out, in);
  }
}

// The regular files directly inside the model directory (config, tokenizer, index, weights).
std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    std::error_code ec2;
    if (e.is_regular_file(ec2)) files.push_back(e.path().string());
  }
  return files;
}

}  // namespace

int convert_hf_to_gguf(const std::string& hf_dir, const std::string& out_path, const ConvertOptions& opt) {
  const GgmlType t = parse_out_type(opt.out_type);
  // The output is checked before any work: it must be a new path or a regular file, and no input.
  gguf::check_output_path(out_path);
  check_not_an_input(out_path, files_in(hf_dir));
  auto m = load_hf_model(hf_dir);
  {
    std::vector<std::string> shards;  // the checkpoint's files, shards in subdirectories included
    for (const auto& [name, t] : m->st->all()) shards.push_back(t.file);
    std::sort(shards.begin(), shards.end());
    shards.erase(std::unique(shards.begin(), shards.end()), shards.end());
    check_not_an_input(out_path, shards);
  }
  const HParams& hp = m->hp;
  // Llama and Mistral (Mixtral too) become llama.cpp's "llama" (Q/K rows permuted for interleaved RoPE); the
  // others keep HF's rotate-half layout under their own arch name (qwen2moe, qwen3moe with experts).
  const bool llama_layout = hp.arch == Arch::Llama || hp.arch == Arch::Mistral;
  const bool gpt_oss = hp.arch == Arch::GptOss;
  const std::string arch = llama_layout ? "llama"
                           : gpt_oss    ? "gpt-oss"
                                        : std::string(arch_name(hp.arch)) + (hp.moe() ? "moe" : "");
  if (hp.moe() && (hp.arch == Arch::Qwen2 || hp.arch == Arch::Qwen3) &&
      hp.expert_norm != (hp.arch == Arch::Qwen3) && opt.warn)
    opt.warn(fmt::format(
        "{}: norm_topk_prob = {}, but llama.cpp (and ultra) {} the top-k weights of {} GGUF files: the GGUF "
        "model routes differently from the checkpoint",
        hf_dir, hp.expert_norm, hp.arch == Arch::Qwen3 ? "renormalise" : "do not renormalise", arch));
  const bool gemma = hp.arch == Arch::Gemma2 || hp.arch == Arch::Gemma3;

  gguf::Writer wr;
  wr.set_string("general.architecture", arch);
  wr.set_string("general.name", std::filesystem::path(hf_dir).filename().string());
  wr.set_u32("general.file_type", file_type(t));
  wr.set_u32("general.quantization_version", 2);
  const std::string a = arch + ".";
  wr.set_u32(a + "context_length", hp.train_ctx);
  if (hp.sliding_window > 0) wr.set_u32(a + "attention.sliding_window", hp.sliding_window);
  if (!hp.swa_layers.empty()) {  // llama.cpp reads a list of bools (or a period)
    std::vector<gguf::Value> flags;
    for (uint8_t f : hp.swa_layers) flags.push_back(gguf::Value::of_bool(f != 0));
    wr.set_value(a + "attention.sliding_window_pattern", gguf::Value::of_array(gguf::ValueType::BOOL, flags));
  }
  if (gemma) {
    if (hp.attn_scale > 0) wr.set_f32(a + "attention.scale", hp.attn_scale);
    if (hp.attn_softcap > 0) wr.set_f32(a + "attn_logit_softcapping", hp.attn_softcap);
    if (hp.final_softcap > 0) wr.set_f32(a + "final_logit_softcapping", hp.final_softcap);
  }
  if (hp.rope_theta_swa > 0) wr.set_f32(a + "rope.freq_base_swa", hp.rope_theta_swa);
  if (hp.rope_scaling.type == "linear") {
    wr.set_string(a + "rope.scaling.type", "linear");
    wr.set_f32(a + "rope.scaling.factor", hp.rope_scaling.factor);
  } else if (hp.rope_scaling.type == "longrope") {
    wr.set_u32(a + "rope.scaling.original_context_length", hp.rope_scaling.original_max_position_embeddings);
    wr.set_f32(a + "rope.scaling.attn_factor", hp.rope_scaling.attention_factor);
  } else if (hp.rope_scaling.type == "yarn") {
    // llama.cpp's keys (as its converter writes them); the attention factor travels as its default
    // 0.1 ln(factor) + 1, and the correction range is rounded (truncate) except for gpt-oss (load_gguf.cpp)
    const RopeScaling& rs = hp.rope_scaling;
    const float mscale = rs.factor <= 1 ? 1.0f : (float)(0.1 * std::log((double)rs.factor) + 1.0);
    if (std::fabs(rs.attention_factor - mscale) > 1e-6f * mscale)
      fail("{}: yarn attention_factor {} differs from 0.1 ln(factor) + 1 = {}, which GGUF files cannot say",
           hf_dir, rs.attention_factor, mscale);
    if (rs.truncate == gpt_oss && opt.warn)
      opt.warn(
          fmt::format("{}: yarn truncate = {} is not what the GGUF reader assumes for {}; the GGUF model's "
                      "RoPE frequencies will differ slightly",
                      hf_dir, rs.truncate, arch));
    wr.set_string(a + "rope.scaling.type", "yarn");
    wr.set_f32(a + "rope.scaling.factor", rs.factor);
    wr.set_u32(a + "rope.scaling.original_context_length", rs.original_max_position_embeddings);
    wr.set_f32(a + "rope.scaling.yarn_beta_fast", rs.beta_fast);
    wr.set_f32(a + "rope.scaling.yarn_beta_slow", rs.beta_slow);
  }
  wr.set_u32(a + "embedding_length", hp.dim);
  wr.set_u32(a + "block_count", hp.n_layers);
  wr.set_u32(a + "feed_forward_length", hp.ffn_dim);
  wr.set_u32(a + "attention.head_count", hp.n_heads);
  wr.set_u32(a + "attention.head_count_kv", hp.n_kv_heads);
  wr.set_u32(a + "attention.key_length", hp.head_dim);
  wr.set_u32(a + "attention.value_length", hp.head_dim);
  wr.set_u32(a + "rope.dimension_count", hp.head_dim);
  wr.set_f32(a + "rope.freq_base", hp.rope_theta);
  wr.set_f32(a + "attention.layer_norm_rms_epsilon", hp.rms_eps);
  wr.set_u32(a + "vocab_size", hp.n_vocab);
  if (hp.moe()) {  // the keys read_expert_keys (model/load_gguf.cpp) and llama.cpp read
    wr.set_u32(a + "expert_count", hp.n_expert);
    wr.set_u32(a + "expert_used_count", hp.n_expert_used);
    if (!llama_layout) wr.set_u32(a + "expert_feed_forward_length", hp.expert_ffn_dim);
    if (hp.shexp_ffn_dim > 0) wr.set_u32(a + "expert_shared_feed_forward_length", hp.shexp_ffn_dim);
  }
  if (hp.bos_id >= 0) wr.set_u32("tokenizer.ggml.bos_token_id", hp.bos_id);
  if (hp.eos_id >= 0) wr.set_u32("tokenizer.ggml.eos_token_id", hp.eos_id);

  int written = 0;
  Emitter E{wr, {}, opt.warn, opt.ternary_per_row};
  E.done = [&](const std::string& name) {
    ++written;
    if (opt.progress) opt.progress(written, E.count, name);
  };
  // --keep-embeddings: the input's own type (F32 / F16 / BF16 from safetensors)
  const GgmlType t_embd = opt.keep_embeddings ? m->tok_embd.type : t;
  const RowOrder same{false, hp.head_dim};
  E.matrix(gguf_name(TensorRole::TokEmbd), m->tok_embd, t_embd, same);
  E.vec(gguf_name(TensorRole::OutputNorm), m->output_norm, hp.dim);
  if (!hp.tie_embeddings)
    E.matrix(gguf_name(TensorRole::Output), m->output, opt.keep_embeddings ? m->output.type : t, same);
  for (int il = 0; il < hp.n_layers; ++il) {
    const LayerWeights& l = m->layers[il];
    // The tensors load_hf_model loaded, in table order. (Gemma's norms were loaded as 1 + w, which is what
    // llama.cpp's GGUF files hold; Phi-3's fused matrices stay fused, as llama.cpp keeps them.)
    for (const TensorSpec& ts : layer_tensors()) {
      if (tensor_need(ts, hp, TensorFormat::Gguf) != Need::Required) continue;
      const std::string name = tensor_name(ts, hp, TensorFormat::Gguf, il);
      const bool permute = llama_layout && ts.rope_rows;
      if (ts.experts && (l.*ts.experts)[0].type == GgmlType::MXFP4) {
        E.raw_experts(name, l.*ts.experts, hp.n_expert);
      } else if (ts.experts) {  // HF's per-expert matrices, stacked: ggml shape {cols, rows, n_expert}
        const WeightView* v = l.*ts.experts;
        WeightView all = v[0];
        all.rows = v[0].rows * hp.n_expert;
        E.matrix(name, all, t, ExpertRows{v, v[0].rows}, nullptr,
                 {(uint64_t)v[0].cols, (uint64_t)v[0].rows, (uint64_t)hp.n_expert});
      } else if (ts.matrix) {
        // The MoE router stays F32, as llama.cpp's converter and llama-quantize keep it (routing decisions
        // are the most rounding-sensitive values of the model).
        const GgmlType tt = ts.role == TensorRole::FfnGateInp ? GgmlType::F32 : t;
        E.matrix(name, l.*ts.matrix, tt, RowOrder{permute, hp.head_dim});
      } else {
        if (permute) fail("{}: attention biases with the llama layout are not supported", hf_dir);
        const int64_t rows = dim_size(ts.rows, hp), cols = dim_size(ts.cols, hp);
        if (ts.cols == Dim::None)
          E.vec(name, l.*ts.vector, rows);
        else  // [rows, cols] (gpt-oss's expert biases): ggml shape {cols, rows}
          E.vec(name, l.*ts.vector, rows * cols, {(uint64_t)cols, (uint64_t)rows});
      }
    }
  }
  if (hp.rope_scaling.type == "longrope") {
    E.vec(gguf_name(TensorRole::RopeFactorsShort), hp.rope_scaling.short_factor.data(), hp.head_dim / 2);
    E.vec(gguf_name(TensorRole::RopeFactorsLong), hp.rope_scaling.long_factor.data(), hp.head_dim / 2);
  }
  if (hp.rope_scaling.type == "llama3") {
    // llama.cpp divides each pair's frequency by rope_freqs[i]: store default / scaled.
    HParams plain = hp;
    plain.rope_scaling = RopeScaling{};
    const std::vector<float> f0 = plain.rope_inv_freq();
    std::vector<float> factors(hp.head_dim / 2);
    for (size_t i = 0; i < factors.size(); ++i) factors[i] = f0[i] / m->rope_inv_freq[i];
    E.vec(gguf_name(TensorRole::RopeFreqs), factors.data(), (int64_t)factors.size());
  }
  if (std::filesystem::exists(std::filesystem::path(hf_dir) / "tokenizer.json")) {
    const tok::Vocab v = tok::load_vocab(hf_dir);
    if ((int)v.tokens.size() > hp.n_vocab)
      fail("{}: tokenizer has {} tokens but the model's vocabulary is {}", hf_dir, v.tokens.size(),
           hp.n_vocab);
    tok::write_gguf_vocab(v, wr, (size_t)hp.n_vocab);
  } else {
    // llama.cpp's mark of a model without a vocabulary (it refuses a file without the key)
    wr.set_string("tokenizer.ggml.model", "none");
    if (opt.warn)
      opt.warn(fmt::format("{}: no tokenizer.json; the GGUF file will have no tokenizer", hf_dir));
  }
  wr.write(out_path);
  return written;
}

}  // namespace ultra

namespace ultra {

namespace {

// GGUF -> GGUF with the matrices in the type of opt (see quantize_model).
int quantize_gguf(const std::string& in_path, const std::string& out_path, const ConvertOptions& opt) {
  const GgmlType t = parse_out_type(opt.out_type);
  gguf::check_output_path(out_path);
  check_not_an_input(out_path, {in_path});
  const gguf::Reader r = gguf::Reader::open(in_path);
  gguf::Writer wr;
  for (const auto& [key, v] : r.metadata())
    if (key != "general.alignment") wr.set_value(key, v);
  wr.set_u32("general.file_type", file_type(t));
  wr.set_u32("general.quantization_version", 2);

  int written = 0;
  Emitter E{wr, {}, opt.warn, opt.ternary_per_row};
  E.done = [&](const std::string& name) {
    ++written;
    if (opt.progress) opt.progress(written, E.count, name);
  };
  // Scale tensors of scaled input matrices: rewritten with their matrix (or copied with it, when kept).
  std::unordered_set<std::string> input_scales;
  for (const auto& ti : r.tensors())
    if (has_scale_tensor(ti.type)) input_scales.insert(scale_tensor_name(ti.name));
  auto same = [](int64_t row) { return row; };
  const std::string embd_name = gguf_name(TensorRole::TokEmbd), output_name = gguf_name(TensorRole::Output);
  for (const auto& ti : r.tensors()) {
    if (input_scales.count(ti.name)) continue;
    const bool experts = stacked_experts(ti) && !has_scale_tensor(ti.type);
    const bool matrix = (ti.ne.size() == 2 || experts) && ti.name.size() > 7 && ti.name.ends_with(".weight");
    const bool embedding = ti.name == embd_name || ti.name == output_name;
    const bool router = ti.name.ends_with("ffn_gate_inp.weight");  // kept, as llama-quantize keeps it
    const bool mxfp4 = ti.type == GgmlType::MXFP4;                 // gpt-oss's experts: kept as they are
    if (!matrix || router || mxfp4 || (embedding && opt.keep_embeddings)) {
      E.copy(ti);
      if (has_scale_tensor(ti.type)) E.copy(*r.find_tensor(scale_tensor_name(ti.name)));
      continue;
    }
    const WeightView w = experts ? stacked_experts_view(ti) : gguf_matrix_view(r, ti, nullptr);
    if (!is_plain_convert_type(w.type))
      fail(
          "{}: tensor '{}' has type {}, which ultra cannot read (F32, F16, BF16, Q8_0, F8_E4M3, TERNARY, "
          "TQ1_0, TQ2_0)",
          in_path, ti.name, type_name(w.type));
    E.matrix(ti.name, w, t, same, nullptr, experts ? ti.ne : std::vector<uint64_t>{});
  }
  wr.write(out_path);
  return written;
}

// An integer hyperparameter of the model's metadata (the first element of a per-layer array), or 0.
int hparam(const gguf::Reader& r, const std::string& key) {
  const gguf::Value* v = r.find(key);
  if (!v) return 0;
  if (v->arr) return v->arr->empty() ? 0 : (int)v->arr->int_at(0);
  return (int)v->as_int();
}

// GGUF -> GGUF in one of llama.cpp's mixes (io/quant_mix.h), with optional importance weights.
int quantize_gguf_mix(const std::string& in_path, const std::string& out_path, const QuantMix& mix,
                      const ConvertOptions& opt) {
  gguf::check_output_path(out_path);
  check_not_an_input(out_path, {in_path, opt.imatrix});
  const gguf::Reader r = gguf::Reader::open(in_path);
  Imatrix im;
  if (!opt.imatrix.empty()) im = load_imatrix(opt.imatrix);

  MixModel mm;
  mm.arch = r.get_string_opt("general.architecture").value_or("");
  const std::string a = mm.arch + ".";
  mm.n_layer = hparam(r, a + "block_count");
  mm.n_head = hparam(r, a + "attention.head_count");
  mm.n_head_kv = hparam(r, a + "attention.head_count_kv");
  if (!r.find(a + "attention.head_count_kv")) mm.n_head_kv = mm.n_head;
  mm.n_expert = hparam(r, a + "expert_count");
  mm.has_imatrix = !opt.imatrix.empty();

  std::vector<MixTensor> mts;
  for (const auto& ti : r.tensors()) mts.push_back({ti.name, ti.ne, ti.type});
  const std::vector<MixChoice> choice = choose_tensor_types(mix, mm, mts);

  gguf::Writer wr;
  for (const auto& [key, v] : r.metadata())
    if (key != "general.alignment") wr.set_value(key, v);
  wr.set_u32("general.quantization_version", 2);
  wr.set_u32("general.file_type", mix.ftype);

  ThreadPool pool(opt.threads > 0 ? opt.threads : std::max(1u, std::thread::hardware_concurrency()));
  int written = 0;
  std::unordered_map<std::string, std::string> lines;  // tensor -> its progress line
  Emitter E{wr, {}, opt.warn, false, &pool};
  E.done = [&](const std::string& name) {
    ++written;
    if (opt.progress) opt.progress(written, E.count, lines[name]);
  };
  size_t used_imatrix = 0;
  for (size_t i = 0; i < r.tensors().size(); ++i) {
    const gguf::TensorInfo& ti = r.tensors()[i];
    const MixChoice& ch = choice[i];
    std::string shape;
    for (uint64_t d : ti.ne) shape += (shape.empty() ? "" : " x ") + std::to_string(d);
    const double mib_in = (double)ti.n_bytes / (1 << 20);
    const bool kept = opt.keep_embeddings && (ti.name == "token_embd.weight" || ti.name == "output.weight");
    if (!ch.quantize || ch.type == ti.type || kept) {
      lines[ti.name] = fmt::format("{:<32} [{}] {}, {:.3f} MiB", ti.name, shape, type_name(ti.type), mib_in);
      E.copy(ti);
      continue;
    }
    const bool experts = stacked_experts(ti);
    if (ti.ne.size() > 2 && ti.n_elements != ti.ne[0] * ti.ne[1] && !experts)
      fail("{}: tensor '{}' has shape [{}]: ultra quantize converts 2-D matrices and stacked experts only",
           in_path, ti.name, shape);
    switch (ti.type) {
      case GgmlType::F32:
      case GgmlType::F16:
      case GgmlType::BF16:
      case GgmlType::Q8_0:
        break;
      default:
        fail(
            "{}: tensor '{}' has type {}; the mixes quantize F32, F16, BF16 or Q8_0 weights (quantize the "
            "unquantized file: requantizing loses accuracy, and llama-quantize refuses it too by default)",
            in_path, ti.name, type_name(ti.type));
    }
    if (!ch.warning.empty() && opt.warn) opt.warn(fmt::format("{}: {}", ti.name, ch.warning));
    const float* qw = nullptr;
    if (auto it = im.weights.find(ti.name); it != im.weights.end()) {
      if (it->second.size() == ti.ne[0]) {
        qw = it->second.data();
        ++used_imatrix;
      } else if (ti.name != "token_embd.weight" && ti.name != "per_layer_token_embd.weight") {
        fail("{}: the imatrix has {} values for '{}', whose rows have {}", opt.imatrix, it->second.size(),
             ti.name, ti.ne[0]);
      }
    } else if (!opt.imatrix.empty() && opt.warn) {
      opt.warn(fmt::format("{}: no importance weights in {}; quantized without them", ti.name, opt.imatrix));
    }
    const WeightView w = experts ? stacked_experts_view(ti) : gguf_matrix_view(r, ti, nullptr);
    const double mib_out = (double)w.rows * row_bytes(*type_traits(ch.type), w.cols) / (1 << 20);
    lines[ti.name] =
        fmt::format("{:<32} [{}] {} -> {}{}, {:.3f} MiB -> {:.3f} MiB", ti.name, shape, type_name(ti.type),
                    type_name(ch.type), qw ? " (imatrix)" : "", mib_in, mib_out);
    E.matrix(
        ti.name, w, ch.type, [](int64_t row) { return row; }, qw, experts ? ti.ne : std::vector<uint64_t>{});
  }
  if (!opt.imatrix.empty() && used_imatrix == 0)
    fail("{}: none of its {} entries names a tensor of {}", opt.imatrix, im.weights.size(), in_path);
  wr.write(out_path);
  return written;
}

}  // namespace

int quantize_model(const std::string& in_path, const std::string& out_path, const ConvertOptions& opt) {
  const QuantMix* mix = find_quant_mix(opt.out_type);
  if (!mix) {
    // an unknown type fails before any work
    try {
      parse_out_type(opt.out_type);
    } catch (const Error&) {
      fail("unknown output type '{}' (choose {}, or q8_0, fp8, ternary, tq1_0, tq2_0, f16, bf16, f32)",
           opt.out_type, quant_mix_names());
    }
    if (!opt.imatrix.empty()) fail("--imatrix applies to the block types ({}) only", quant_mix_names());
  }
  std::error_code ec;
  if (!opt.imatrix.empty() && !std::filesystem::is_regular_file(opt.imatrix, ec))
    fail("{}: the imatrix file does not exist or is not a regular file", opt.imatrix);
  if (std::filesystem::is_directory(in_path, ec)) {
    if (!mix) return convert_hf_to_gguf(in_path, out_path, opt);
    // llama.cpp's route: the HF weights to an F32 GGUF (lossless: a temporary file beside the output,
    // removed afterwards), that file to the mix
    gguf::check_output_path(out_path);
    check_not_an_input(out_path, files_in(in_path));
    const std::string tmp = out_path + ".f32-tmp.gguf";
    struct Remove {
      std::string path;
      ~Remove() {
        std::error_code e;
        std::filesystem::remove(path, e);
      }
    } remove_tmp{tmp};
    ConvertOptions f32 = opt;
    f32.out_type = "f32";
    f32.progress = nullptr;
    convert_hf_to_gguf(in_path, tmp, f32);
    return quantize_gguf_mix(tmp, out_path, *mix, opt);
  }
  if (!std::filesystem::exists(in_path, ec)) fail("{}: no such file or directory", in_path);
  return mix ? quantize_gguf_mix(in_path, out_path, *mix, opt) : quantize_gguf(in_path, out_path, opt);
}

}  // namespace ultra
