// ultra::Model, ultra::Tokenizer, ultra::TextStream and ultra::EncodeStream: the public handles over the
// loaded model (model/model.h) and the tokenizer (tokenizer/tokenizer.h, tokenizer/encode_stream.h).
#include <algorithm>
#include <filesystem>

#include "core/error.h"
#include "core/mmap.h"
#include "dist/communicator.h"
#include "engine/access.h"
#include "engine/model_impl.h"
#include "engine/tensor_parallel.h"
#include "io/gguf.h"
#include "model/shard.h"
#include "tokenizer/encode_stream.h"

namespace ultra {

// ---- Tokenizer ----

Tokenizer Tokenizer::load(const std::string& path) {
  return Tokenizer(std::make_shared<const Impl>(Impl{tok::Tokenizer::from_file(path)}));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
  return impl_->t.encode(text, add_special, parse_special);
}
std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  return impl_->t.decode(ids, skip_special);
}
std::string_view Tokenizer::token_to_piece(int32_t id) const {
  return impl_->t.token_to_piece(id);
}
std::vector<int32_t> Tokenizer::encode_with_literal(std::string_view text, std::span<const Span> literal,
                                                    bool add_special) const {
  std::vector<tok::Tokenizer::Span> spans(literal.size());
  for (size_t i = 0; i < literal.size(); ++i) spans[i] = {literal[i].begin, literal[i].end};
  std::vector<int32_t> out;
  impl_->t.encode_with_literal(text, spans, out, add_special);
  return out;
}
int32_t Tokenizer::find_special(std::string_view text, size_t* at) const {
  return impl_->t.find_special(text, at);
}
int32_t Tokenizer::n_vocab() const {
  return impl_->t.n_vocab();
}
int32_t Tokenizer::bos() const {
  return impl_->t.bos();
}
int32_t Tokenizer::eos() const {
  return impl_->t.eos();
}
bool Tokenizer::add_bos() const {
  return impl_->t.add_bos();
}
bool Tokenizer::is_special(int32_t id) const {
  return impl_->t.is_special(id);
}
bool Tokenizer::is_eog(int32_t id) const {
  return impl_->t.is_eog(id);
}

// ---- TextStream ----

struct TextStream::Impl {
  tok::Detokenizer d;
  std::vector<char> buf;
};

TextStream::TextStream(const Tokenizer& tok, bool skip_special)
    : impl_(std::make_unique<Impl>(Impl{tok::Detokenizer(detail::impl(tok).t, {skip_special, true}), {}})) {
  impl_->buf.resize(impl_->d.max_bytes_per_push() + 16);
}
TextStream::~TextStream() = default;
TextStream::TextStream(TextStream&&) noexcept = default;
TextStream& TextStream::operator=(TextStream&&) noexcept = default;

std::string_view TextStream::push(int32_t id) {
  return {impl_->buf.data(), impl_->d.push(id, impl_->buf.data(), impl_->buf.size())};
}
std::string_view TextStream::flush() {
  return {impl_->buf.data(), impl_->d.flush(impl_->buf.data(), impl_->buf.size())};
}
void TextStream::reset() {
  impl_->d.reset();
}

// ---- EncodeStream ----

struct EncodeStream::Impl {
  tok::EncodeStream e;
};

EncodeStream::EncodeStream(const Tokenizer& tok, bool add_special, bool parse_special)
    : impl_(
          std::make_unique<Impl>(Impl{tok::EncodeStream(detail::impl(tok).t, add_special, parse_special)})) {}
EncodeStream::~EncodeStream() = default;
EncodeStream::EncodeStream(EncodeStream&&) noexcept = default;
EncodeStream& EncodeStream::operator=(EncodeStream&&) noexcept = default;

void EncodeStream::feed(std::string_view text, std::vector<int32_t>& out) {
  impl_->e.feed(text, out);
}
void EncodeStream::finish(std::vector<int32_t>& out) {
  impl_->e.finish(out);
}

// ---- Model ----

namespace {

double n_params(const HParams& hp) {
  const double q = (double)hp.n_heads * hp.head_dim, kv = (double)hp.n_kv_heads * hp.head_dim;
  // The FFN: dense, or every expert (total, not active, parameters), the router and the shared expert.
  const double ffn = hp.moe() ? hp.n_expert * (3.0 * hp.dim * hp.expert_ffn_dim + hp.dim) +
                                    3.0 * hp.dim * hp.shexp_ffn_dim + (hp.shexp_ffn_dim > 0 ? hp.dim : 0)
                              : 3.0 * hp.dim * hp.ffn_dim;
  const double layer = hp.dim * (2 * q + 2 * kv) + ffn + 2.0 * hp.dim;
  return hp.n_layers * layer + (hp.tie_embeddings ? 1 : 2) * (double)hp.n_vocab * hp.dim + hp.dim;
}

// The model's own tokenizer (GGUF tokenizer.ggml.* keys, or tokenizer.json in an HF directory), or none.
std::optional<tok::Tokenizer> load_own_tokenizer(const ModelData& m) {
  namespace fs = std::filesystem;
  std::optional<tok::Tokenizer> t;
  if (m.gguf) {
    if (!m.gguf->find("tokenizer.ggml.model")) return t;
    if (const std::string kind = m.gguf->get_string("tokenizer.ggml.model");
        kind == "none" || kind == "no_vocab")
      return t;                          // llama.cpp's mark of a model without a vocabulary
    t.emplace(tok::load_gguf(*m.gguf));  // the file is already mapped
  } else {
    std::error_code ec;
    if (!fs::exists(fs::path(m.path) / "tokenizer.json", ec)) return t;
    t.emplace(tok::Tokenizer::from_file(m.path));
  }
  if (t->n_vocab() > m.hp.n_vocab)
    fail("{}: the tokenizer has {} tokens, more than the model's {} embeddings", m.path, t->n_vocab(),
         m.hp.n_vocab);
  return t;
}

// Makes im's model this rank's shard of params.tp (model/shard.h), over MPI_COMM_WORLD.
void split_model(Model::Impl& im, const LoadParams& params) {
  ModelData& m = *im.data;
  dist::DistOptions o;
  const int64_t vocab_shard = (m.hp.n_vocab + params.tp - 1) / params.tp;
  o.capacity = std::max<size_t>(o.capacity, (size_t)vocab_shard);  // gather_vocab: one row at least
  o.timeout_s = params.tp_timeout_s;
  std::shared_ptr<dist::Communicator> comm = dist::make_mpi_communicator(o);
  try {  // every rank refuses alike (shard_model checks every rank's splits on every rank)
    if (comm->size() != params.tp)
      fail("--tp {}, but this job has {} MPI ranks (start it as mpirun -np {} ... --tp {})", params.tp,
           comm->size(), params.tp, params.tp);
    shard_model(m, comm->rank(), comm->size());
  } catch (const Error& e) {
    if (comm->rank() == 0) throw;
    throw Error(e.what(), true);
  }
  m.comm = std::move(comm);
  im.info.tp_rank = m.tp_rank;
  im.info.tp_size = m.tp_size;
  im.info.shard_weight_bytes = m.weight_bytes;
}

}  // namespace

Model::Impl::~Impl() {
  if (data && data->comm && data->tp_rank == 0) tp_send(*data->comm, TpCmd::end);
}

Model Model::load(const std::string& path, const LoadParams& params) {
  const ReadIntoMemoryScope scope(!params.mmap);  // every file this load maps (the tokenizer's too)
  if (params.tp < 1) fail("--tp must be >= 1 (got {})", params.tp);
  if (params.tp > 1 && read_into_memory())
    fail(
        "--tp: each rank reads only its slices of the mapped model; --no-mmap (or ULTRA_NO_MMAP) would read "
        "all of it on every rank");
  auto im = std::make_shared<Impl>();
  im->data = load_model(path);
  const ModelData& m = *im->data;
  if (auto t = load_own_tokenizer(m))
    im->tokenizer = Tokenizer(std::make_shared<const Tokenizer::Impl>(Tokenizer::Impl{std::move(*t)}));

  const HParams& hp = m.hp;
  ModelInfo& i = im->info;
  i.path = m.path;
  i.format = m.format;
  i.arch = !hp.moe() || hp.arch == Arch::GptOss ? arch_name(hp.arch)
           : hp.arch == Arch::Qwen2             ? "qwen2moe"
           : hp.arch == Arch::Qwen3             ? "qwen3moe"
                                                : "mixtral";
  i.n_expert = hp.n_expert;
  i.n_expert_used = hp.n_expert_used;
  i.weight_type = std::string(type_name(m.layers.empty() ? m.output.type : m.layers[0].wq.type));
  std::transform(i.weight_type.begin(), i.weight_type.end(), i.weight_type.begin(),
                 [](unsigned char c) { return (char)std::tolower(c); });
  i.n_vocab = hp.n_vocab;
  i.dim = hp.dim;
  i.n_layers = hp.n_layers;
  i.n_heads = hp.n_heads;
  i.n_kv_heads = hp.n_kv_heads;
  i.head_dim = hp.head_dim;
  i.ffn_dim = hp.ffn_dim;
  i.train_ctx = hp.train_ctx;
  i.weight_bytes = m.weight_bytes;
  i.shard_weight_bytes = m.weight_bytes;
  i.active_weight_bytes = m.weight_bytes;
  for (const LayerWeights& l : m.layers)
    for (const WeightView* exps : {l.gate_exps, l.up_exps, l.down_exps})
      if (exps)  // every expert has the same size
        i.active_weight_bytes -=
            (size_t)(hp.n_expert - hp.n_expert_used) * (size_t)exps[0].rows * exps[0].row_bytes;
  i.n_params = n_params(hp);

  // End of generation: the vocabulary's (eos / eot / eom and llama.cpp's end-of-turn texts) and the model's
  // own eos ids.
  auto add = [&](int32_t id) {
    if (id >= 0 && id < hp.n_vocab) im->eog.push_back(id);
  };
  add(hp.eos_id);
  for (int32_t id : hp.eos_ids) add(id);
  if (im->tokenizer) {
    const tok::Tokenizer& t = detail::impl(*im->tokenizer).t;
    for (int32_t id : t.eog_ids()) add(id);
  }
  std::sort(im->eog.begin(), im->eog.end());
  im->eog.erase(std::unique(im->eog.begin(), im->eog.end()), im->eog.end());
  if (params.tp > 1) split_model(*im, params);
  return Model(std::move(im));
}

const ModelInfo& Model::info() const {
  return impl_->info;
}
const Tokenizer* Model::tokenizer() const {
  return impl_->tokenizer ? &*impl_->tokenizer : nullptr;
}
std::span<const int32_t> Model::eog_ids() const {
  return impl_->eog;
}
bool Model::is_eog(int32_t id) const {
  return std::binary_search(impl_->eog.begin(), impl_->eog.end(), id);
}

const std::string& Model::chat_template() const {
  static const std::string none;
  return impl_->tokenizer ? detail::impl(*impl_->tokenizer).t.vocab().chat_template : none;
}

}  // namespace ultra
