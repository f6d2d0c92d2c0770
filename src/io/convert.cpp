#include "io/convert.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/error.h"
#include "io/gguf.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "tokenizer/gguf_export.h"

namespace ultra {

GgmlType parse_out_type(const std::string& s) {
  std::string l = s;
  std::transform(l.begin(), l.end(), l.begin(), ::tolower);
  if (l == "f32") return GgmlType::F32;
  if (l == "f16") return GgmlType::F16;
  if (l == "bf16") return GgmlType::BF16;
  if (l == "q8_0") return GgmlType::Q8_0;
  fail("unknown output type '{}' (choose f32, f16, bf16 or q8_0)", s);
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
    default:
      return 0;
  }
}

// Row r of w as f32.
void row_f32(const WeightView& w, int64_t r, float* out) {
  cpu::dequant_row(w, r, out);
}

// Adds tensors to the writer as producers: each matrix is converted when write() reaches it, so only one
// converted tensor is in memory at a time. Every produced tensor reports progress.
struct Emitter {
  gguf::Writer& wr;
  std::function<void(const std::string&)> done;
  int count = 0;

  // A matrix [rows, cols] in type t; row_src(r) gives the source row index (for the Q/K permutation).
  template <class RowMap>
  void matrix(const std::string& name, const WeightView& w, GgmlType t, RowMap row_src) {
    if (t == GgmlType::Q8_0 && w.cols % kQ8_0Block != 0)
      fail("{}: {} columns are not a multiple of 32; cannot write Q8_0", name, w.cols);
    ++count;
    wr.add_tensor(name, t, {(uint64_t)w.cols, (uint64_t)w.rows}, [this, name, w, t, row_src](uint8_t* dst) {
      const size_t rb = row_bytes(*type_traits(t), w.cols);
      std::vector<float> row(w.cols);
      for (int64_t r = 0; r < w.rows; ++r) {
        row_f32(w, row_src(r), row.data());
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
          default:
            fail("unsupported output type {}", type_name(t));
        }
      }
      done(name);
    });
  }

  void vec(const std::string& name, const float* v, int64_t n) {
    ++count;
    std::vector<float> copy(v, v + n);
    wr.add_tensor(name, GgmlType::F32, {(uint64_t)n}, [this, name, copy](uint8_t* dst) {
      std::memcpy(dst, copy.data(), 4 * copy.size());
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
  if (t != GgmlType::F32 && t != GgmlType::F16 && t != GgmlType::BF16 && t != GgmlType::Q8_0)
    fail("unsupported output type {}", type_name(t));
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
  // Llama and Mistral become llama.cpp's "llama" (Q/K rows permuted for interleaved RoPE); the others keep
  // HF's rotate-half layout under their own arch name.
  const bool llama_layout = hp.arch == Arch::Llama || hp.arch == Arch::Mistral;
  const std::string arch = llama_layout ? "llama" : arch_name(hp.arch);
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
  if (hp.bos_id >= 0) wr.set_u32("tokenizer.ggml.bos_token_id", hp.bos_id);
  if (hp.eos_id >= 0) wr.set_u32("tokenizer.ggml.eos_token_id", hp.eos_id);

  int written = 0;
  Emitter E{wr, {}};
  E.done = [&](const std::string& name) {
    ++written;
    if (opt.progress) opt.progress(written, E.count, name);
  };
  auto same = [](int64_t r) { return r; };
  // HF rotate-half rows (h, a, j) -> interleaved rows (h, j, a), a in {0,1}, j < head_dim/2 (llama.cpp
  // permute)
  const int64_t hd = hp.head_dim, half = hd / 2;
  auto permuted = [=](int64_t r) {
    const int64_t h = r / hd, i = r % hd, j = i / 2, a = i % 2;
    return h * hd + a * half + j;
  };
  E.matrix("token_embd.weight", m->tok_embd, t, same);
  E.vec("output_norm.weight", m->output_norm, hp.dim);
  if (!hp.tie_embeddings) E.matrix("output.weight", m->output, t, same);
  const int64_t q_dim = (int64_t)hp.n_heads * hp.head_dim, kv_dim = (int64_t)hp.n_kv_heads * hp.head_dim;
  for (int il = 0; il < hp.n_layers; ++il) {
    const LayerWeights& l = m->layers[il];
    const std::string p = "blk." + std::to_string(il) + ".";
    // (Gemma's norms were loaded as 1 + w, which is what llama.cpp's GGUF files hold.)
    E.vec(p + "attn_norm.weight", l.attn_norm, hp.dim);
    if (l.wqkv.data) {  // Phi-3: fused as llama.cpp keeps it
      E.matrix(p + "attn_qkv.weight", l.wqkv, t, same);
    } else if (llama_layout) {
      E.matrix(p + "attn_q.weight", l.wq, t, permuted);
      E.matrix(p + "attn_k.weight", l.wk, t, permuted);
    } else {
      E.matrix(p + "attn_q.weight", l.wq, t, same);
      E.matrix(p + "attn_k.weight", l.wk, t, same);
    }
    if (!l.wqkv.data) E.matrix(p + "attn_v.weight", l.wv, t, same);
    E.matrix(p + "attn_output.weight", l.wo, t, same);
    if (l.bq) {
      if (llama_layout) fail("{}: attention biases with the llama layout are not supported", hf_dir);
      E.vec(p + "attn_q.bias", l.bq, q_dim);
      E.vec(p + "attn_k.bias", l.bk, kv_dim);
      E.vec(p + "attn_v.bias", l.bv, kv_dim);
    }
    if (l.q_norm) {
      E.vec(p + "attn_q_norm.weight", l.q_norm, hp.head_dim);
      E.vec(p + "attn_k_norm.weight", l.k_norm, hp.head_dim);
    }
    if (l.attn_post_norm) E.vec(p + "post_attention_norm.weight", l.attn_post_norm, hp.dim);
    E.vec(p + "ffn_norm.weight", l.ffn_norm, hp.dim);
    if (l.ffn_post_norm) E.vec(p + "post_ffw_norm.weight", l.ffn_post_norm, hp.dim);
    if (l.w_gate_up.data) {  // Phi-3: [W_gate; W_up] as ffn_up
      E.matrix(p + "ffn_up.weight", l.w_gate_up, t, same);
    } else {
      E.matrix(p + "ffn_gate.weight", l.w_gate, t, same);
      E.matrix(p + "ffn_up.weight", l.w_up, t, same);
    }
    E.matrix(p + "ffn_down.weight", l.w_down, t, same);
  }
  if (hp.rope_scaling.type == "longrope") {
    E.vec("rope_factors_short.weight", hp.rope_scaling.short_factor.data(), hp.head_dim / 2);
    E.vec("rope_factors_long.weight", hp.rope_scaling.long_factor.data(), hp.head_dim / 2);
  }
  if (hp.rope_scaling.type == "llama3") {
    // llama.cpp divides each pair's frequency by rope_freqs[i]: store default / scaled.
    HParams plain = hp;
    plain.rope_scaling = RopeScaling{};
    const std::vector<float> f0 = plain.rope_inv_freq();
    std::vector<float> factors(hp.head_dim / 2);
    for (size_t i = 0; i < factors.size(); ++i) factors[i] = f0[i] / m->rope_inv_freq[i];
    E.vec("rope_freqs.weight", factors.data(), (int64_t)factors.size());
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
