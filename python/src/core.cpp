// ultra._core: the pybind11 extension under the `ultra` Python package. It binds the public C++ API
// (include/ultra only) one class for one class: Model, Tokenizer, TextStream, SamplingParams, Batch, Context,
// ChatFormatter and StopStrings. The high-level API (ultra.LLM) is pure Python on top (python/ultra/).
//
// Rules kept here:
//  * The GIL is released for every call that runs the model or reads model files (Model.load,
//    Context(...), step, submit, wait, generate, generate_speculative) and for Tokenizer.encode; a Context
//    is used by one thread at a time (a second thread's call while a step runs raises ultra.Error instead
//    of racing), and a Batch must not be changed by another thread while a step reads it.
//  * Every ultra::Error becomes a Python exception with the C++ message: ultra.ModelError from loading a
//    model or tokenizer, ultra.InvalidArgument (also a ValueError) from a call whose arguments the engine
//    refuses (context parameters, batch rows, sampling fields, token ids, chat messages), ultra.Error (a
//    RuntimeError) otherwise. Wrong Python types raise TypeError (pybind11's conversions).
//  * Context.logits(row) is a read-only float32 NumPy array of n_vocab viewing the context's own buffer (no
//    copy): valid until the context's next step (the array keeps the context alive, not the values).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <optional>
#include <string>
#include <vector>

#include "ultra/chat.h"
#include "ultra/ultra.h"

namespace py = pybind11;
using namespace ultra;

namespace {

// ---- exceptions -----------------------------------------------------------------------------------------

PyObject* g_error = nullptr;        // ultra.Error(RuntimeError)
PyObject* g_model_error = nullptr;  // ultra.ModelError(Error)
PyObject* g_invalid = nullptr;      // ultra.InvalidArgument(Error, ValueError)

// Which Python exception an ultra::Error becomes, by the call that threw it.
struct ModelLoadError : Error {
  using Error::Error;
};
struct InvalidArgumentError : Error {
  using Error::Error;
};

// Runs f; an ultra::Error it throws is rethrown as E (same message).
template <class E, class F>
auto as(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const ModelLoadError&) {
    throw;
  } catch (const InvalidArgumentError&) {
    throw;
  } catch (const Error& e) {
    throw E(e.what());
  }
}

[[noreturn]] void invalid(const std::string& msg) {
  throw InvalidArgumentError(msg);
}

// Text from the engine (token bytes, decoded text) as a Python str: ill-formed UTF-8 becomes U+FFFD.
py::str utf8(std::string_view s) {
  PyObject* o = PyUnicode_DecodeUTF8(s.data(), (Py_ssize_t)s.size(), "replace");
  if (!o) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(o);
}

// A TextStream with the tokenizer it checks ids against.
struct PyTextStream {
  Tokenizer tok;
  TextStream stream;
  PyTextStream(const Tokenizer& t, bool skip_special) : tok(t), stream(t, skip_special) {}
};

// ---- Context with a busy flag -----------------------------------------------------------------------------

struct PyContext {
  Context ctx;
  std::atomic<bool> busy{false};
  explicit PyContext(Context&& c) : ctx(std::move(c)) {}
};

// Marks the context busy for the scope; a concurrent call from another thread raises instead of racing.
class Busy {
 public:
  explicit Busy(PyContext& c) : c_(c) {
    if (c_.busy.exchange(true)) throw Error("ultra.Context: another thread is using this context");
  }
  ~Busy() { c_.busy.store(false); }
  Busy(const Busy&) = delete;
  Busy& operator=(const Busy&) = delete;

 private:
  PyContext& c_;
};

template <class F>
auto guarded(PyContext& c, F&& f) -> decltype(f()) {
  Busy b(c);
  return as<InvalidArgumentError>(f);
}

// The same, with the GIL released while f runs (model calls).
template <class F>
auto released(PyContext& c, F&& f) -> decltype(f()) {
  Busy b(c);
  py::gil_scoped_release nogil;
  return as<InvalidArgumentError>(f);
}

BackendKind parse_device(const std::string& d) {
  if (d == "cpu") return BackendKind::cpu;
  if (d == "cuda" || d == "gpu") return BackendKind::cuda;
  invalid("device must be 'cpu' or 'cuda', not '" + d + "'");
}

KvType parse_kv(const std::string& t) {
  if (t == "f32") return KvType::f32;
  if (t == "f16") return KvType::f16;
  if (t == "bf16") return KvType::bf16;
  invalid("kv_type must be 'f32', 'f16' or 'bf16', not '" + t + "'");
}

void check_row(const Batch& b, int row) {
  if (row < 0 || row >= b.size())
    throw py::index_error("batch row " + std::to_string(row) + " out of range (" + std::to_string(b.size()) +
                          " rows)");
}

std::string repr_sampling(const SamplingParams& p) {
  return "SamplingParams(temperature=" + py::repr(py::float_(p.temperature)).cast<std::string>() +
         ", top_k=" + std::to_string(p.top_k) +
         ", top_p=" + py::repr(py::float_(p.top_p)).cast<std::string>() +
         ", min_p=" + py::repr(py::float_(p.min_p)).cast<std::string>() +
         ", repeat_penalty=" + py::repr(py::float_(p.repeat_penalty)).cast<std::string>() +
         ", repeat_last_n=" + std::to_string(p.repeat_last_n) +
         ", presence_penalty=" + py::repr(py::float_(p.presence_penalty)).cast<std::string>() +
         ", frequency_penalty=" + py::repr(py::float_(p.frequency_penalty)).cast<std::string>() +
         ", seed=" + std::to_string(p.seed) + ", n_probs=" + std::to_string(p.n_probs) + ")";
}

void bind_errors(py::module_& m) {
  g_error = PyErr_NewExceptionWithDoc("ultra.Error", "Every error the engine reports (ultra::Error).",
                                      PyExc_RuntimeError, nullptr);
  g_model_error = PyErr_NewExceptionWithDoc(
      "ultra.ModelError", "A model or tokenizer could not be loaded (missing file, malformed GGUF, ...).",
      g_error, nullptr);
  py::tuple bases = py::make_tuple(py::handle(g_error), py::handle(PyExc_ValueError));
  g_invalid = PyErr_NewExceptionWithDoc(
      "ultra.InvalidArgument",
      "The engine refused an argument: context parameters, batch rows, sampling fields, token ids, chat "
      "messages. Also a ValueError.",
      bases.ptr(), nullptr);
  if (!g_error || !g_model_error || !g_invalid) throw py::error_already_set();
  m.attr("Error") = py::handle(g_error);
  m.attr("ModelError") = py::handle(g_model_error);
  m.attr("InvalidArgument") = py::handle(g_invalid);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ModelLoadError& e) {
      PyErr_SetString(g_model_error, e.what());
    } catch (const InvalidArgumentError& e) {
      PyErr_SetString(g_invalid, e.what());
    } catch (const Error& e) {
      PyErr_SetString(g_error, e.what());
    }
  });
}

void bind_sampling(py::module_& m) {
  py::class_<SamplingParams>(m, "SamplingParams",
                             "Sampling settings of one sequence (llama.cpp's defaults and chain; "
                             "include/ultra/sampling.h). temperature <= 0 is greedy.")
      .def(py::init([](float temperature, int top_k, float top_p, float min_p, float repeat_penalty,
                       int repeat_last_n, float presence_penalty, float frequency_penalty, uint64_t seed,
                       int n_probs) {
             SamplingParams p;
             p.temperature = temperature;
             p.top_k = top_k;
             p.top_p = top_p;
             p.min_p = min_p;
             p.repeat_penalty = repeat_penalty;
             p.repeat_last_n = repeat_last_n;
             p.presence_penalty = presence_penalty;
             p.frequency_penalty = frequency_penalty;
             p.seed = seed;
             p.n_probs = n_probs;
             as<InvalidArgumentError>([&] { p.validate(); });
             return p;
           }),
           py::kw_only(), py::arg("temperature") = 0.8f, py::arg("top_k") = 40, py::arg("top_p") = 0.95f,
           py::arg("min_p") = 0.05f, py::arg("repeat_penalty") = 1.0f, py::arg("repeat_last_n") = 64,
           py::arg("presence_penalty") = 0.0f, py::arg("frequency_penalty") = 0.0f,
           py::arg("seed") = (uint64_t)0xdeadbeef, py::arg("n_probs") = 0,
           "Raises ultra.InvalidArgument naming the first field out of range.")
      .def_static("greedy", &SamplingParams::greedy, "temperature 0: the argmax (ties to the lowest id)")
      .def("validate", [](const SamplingParams& p) { as<InvalidArgumentError>([&] { p.validate(); }); })
      .def_readwrite("temperature", &SamplingParams::temperature)
      .def_readwrite("top_k", &SamplingParams::top_k)
      .def_readwrite("top_p", &SamplingParams::top_p)
      .def_readwrite("min_p", &SamplingParams::min_p)
      .def_readwrite("repeat_penalty", &SamplingParams::repeat_penalty)
      .def_readwrite("repeat_last_n", &SamplingParams::repeat_last_n)
      .def_readwrite("presence_penalty", &SamplingParams::presence_penalty)
      .def_readwrite("frequency_penalty", &SamplingParams::frequency_penalty)
      .def_readwrite("seed", &SamplingParams::seed)
      .def_readwrite("n_probs", &SamplingParams::n_probs)
      .def("__repr__", &repr_sampling)
      .def("__eq__", [](const SamplingParams& a,
                        const SamplingParams& b) { return repr_sampling(a) == repr_sampling(b); })
      .def("__copy__", [](const SamplingParams& p) { return p; })
      .def("__deepcopy__", [](const SamplingParams& p, py::dict) { return p; })
      .def_readonly_static("MAX_PROBS", &SamplingParams::kMaxProbs);
}

void bind_model(py::module_& m) {
  py::class_<Tokenizer>(m, "Tokenizer", "Text <-> token ids (byte-level BPE and SentencePiece).")
      .def_static(
          "load",
          [](const std::string& path) {
            py::gil_scoped_release nogil;
            return as<ModelLoadError>([&] { return Tokenizer::load(path); });
          },
          py::arg("path"), "A .gguf file, a tokenizer.json, or an HF directory holding one.")
      .def(
          "encode",
          [](const Tokenizer& t, std::string_view text, bool add_special, bool parse_special) {
            std::vector<int32_t> ids;
            {
              py::gil_scoped_release nogil;  // a long text takes a while; the str is immutable
              ids = t.encode(text, add_special, parse_special);
            }
            return ids;
          },
          py::arg("text"), py::arg("add_special") = true, py::arg("parse_special") = true,
          "Token ids of text. add_special: BOS/EOS as the vocabulary asks; parse_special: recognise control "
          "tokens written in the text (as `ultra run -p` and the server's completions do).")
      .def(
          "decode",
          [](const Tokenizer& t, const std::vector<int32_t>& ids, bool skip_special) {
            return utf8(as<InvalidArgumentError>([&] { return t.decode(ids, skip_special); }));
          },
          py::arg("ids"), py::arg("skip_special") = false,
          "Text of the ids (ill-formed UTF-8 as U+FFFD). Raises ultra.InvalidArgument for an id out of "
          "range.")
      .def(
          "decode_bytes",
          [](const Tokenizer& t, const std::vector<int32_t>& ids, bool skip_special) {
            return py::bytes(as<InvalidArgumentError>([&] { return t.decode(ids, skip_special); }));
          },
          py::arg("ids"), py::arg("skip_special") = false, "The bytes of the ids, as they are.")
      .def(
          "token_to_piece",
          [](const Tokenizer& t, int32_t id) {
            if (id < 0 || id >= t.n_vocab())
              invalid("token id " + std::to_string(id) + " out of range (vocabulary of " +
                      std::to_string(t.n_vocab()) + ")");
            return py::bytes(std::string(t.token_to_piece(id)));
          },
          py::arg("id"), "The bytes of one token (control tokens: their text).")
      .def(
          "find_special",
          [](const Tokenizer& t, std::string_view text) {
            size_t at = 0;
            const int32_t id = t.find_special(text, &at);
            return id < 0 ? py::object(py::none()) : py::object(py::make_tuple(id, at));
          },
          py::arg("text"), "(id, byte offset) of the first control token written in text, or None.")
      .def_property_readonly("n_vocab", &Tokenizer::n_vocab)
      .def_property_readonly("bos", &Tokenizer::bos, "BOS id, -1 if none")
      .def_property_readonly("eos", &Tokenizer::eos, "EOS id, -1 if none")
      .def_property_readonly("add_bos", &Tokenizer::add_bos)
      .def(
          "is_special",
          [](const Tokenizer& t, int32_t id) {
            return as<InvalidArgumentError>([&] { return t.is_special(id); });
          },
          py::arg("id"))
      .def(
          "is_eog",
          [](const Tokenizer& t, int32_t id) {
            return as<InvalidArgumentError>([&] { return t.is_eog(id); });
          },
          py::arg("id"))
      .def("__len__", &Tokenizer::n_vocab);

  py::class_<PyTextStream>(m, "TextStream",
                           "Generated text token by token, complete UTF-8 characters only (a split character "
                           "waits for its next token).")
      .def(py::init([](const Tokenizer& t, bool skip_special) {
             return std::make_unique<PyTextStream>(t, skip_special);
           }),
           py::arg("tokenizer"), py::arg("skip_special") = true)
      .def(
          "push",
          [](PyTextStream& s, int32_t id) {
            if (id < 0 || id >= s.tok.n_vocab())
              invalid("token id " + std::to_string(id) + " out of range (vocabulary of " +
                      std::to_string(s.tok.n_vocab()) + ")");
            return utf8(s.stream.push(id));
          },
          py::arg("id"), "The text this token completes ('' while a character is incomplete).")
      .def(
          "flush", [](PyTextStream& s) { return utf8(s.stream.flush()); }, "What is held back, at the end.")
      .def("reset", [](PyTextStream& s) { s.stream.reset(); });

  py::class_<ModelInfo>(m, "ModelInfo", "What a model is (include/ultra/model.h's ModelInfo).")
      .def_readonly("path", &ModelInfo::path)
      .def_readonly("format", &ModelInfo::format)
      .def_readonly("arch", &ModelInfo::arch)
      .def_readonly("weight_type", &ModelInfo::weight_type)
      .def_readonly("n_vocab", &ModelInfo::n_vocab)
      .def_readonly("dim", &ModelInfo::dim)
      .def_readonly("n_layers", &ModelInfo::n_layers)
      .def_readonly("n_heads", &ModelInfo::n_heads)
      .def_readonly("n_kv_heads", &ModelInfo::n_kv_heads)
      .def_readonly("head_dim", &ModelInfo::head_dim)
      .def_readonly("ffn_dim", &ModelInfo::ffn_dim)
      .def_readonly("n_expert", &ModelInfo::n_expert)
      .def_readonly("n_expert_used", &ModelInfo::n_expert_used)
      .def_readonly("train_ctx", &ModelInfo::train_ctx)
      .def_readonly("weight_bytes", &ModelInfo::weight_bytes)
      .def_readonly("n_params", &ModelInfo::n_params)
      .def("__repr__", [](const ModelInfo& i) {
        return "ModelInfo(path='" + i.path + "', arch='" + i.arch + "', weight_type='" + i.weight_type +
               "', n_layers=" + std::to_string(i.n_layers) + ", dim=" + std::to_string(i.dim) +
               ", n_vocab=" + std::to_string(i.n_vocab) + ")";
      });

  py::class_<Model>(m, "Model", "A loaded model (GGUF file or HF directory) and its tokenizer.")
      .def(py::init([](const std::string& path, bool mmap) {
             py::gil_scoped_release nogil;
             LoadParams lp;
             lp.mmap = mmap;
             return as<ModelLoadError>([&] { return Model::load(path, lp); });
           }),
           py::arg("path"), py::arg("mmap") = true,
           "Loads a GGUF file or an HF model directory. Raises ultra.ModelError naming the file and the "
           "problem.")
      .def_static(
          "load",
          [](const std::string& path, bool mmap) {
            py::gil_scoped_release nogil;
            LoadParams lp;
            lp.mmap = mmap;
            return as<ModelLoadError>([&] { return Model::load(path, lp); });
          },
          py::arg("path"), py::arg("mmap") = true)
      .def_property_readonly("info", &Model::info, py::return_value_policy::reference_internal)
      .def_property_readonly(
          "tokenizer",
          [](const Model& mo) { return mo.tokenizer() ? py::cast(*mo.tokenizer()) : py::object(py::none()); },
          "The model's own tokenizer, or None.")
      .def_property_readonly("n_vocab", [](const Model& mo) { return mo.info().n_vocab; })
      .def_property_readonly(
          "eog_ids",
          [](const Model& mo) { return std::vector<int32_t>(mo.eog_ids().begin(), mo.eog_ids().end()); },
          "Every end-of-generation id the model declares, ascending.")
      .def("is_eog", &Model::is_eog, py::arg("id"))
      .def_property_readonly("chat_template", &Model::chat_template,
                             "The Jinja chat template the model ships ('' when none).")
      .def("__repr__", [](const Model& mo) { return "ultra.Model('" + mo.info().path + "')"; });
}

void bind_batch(py::module_& m) {
  py::enum_<Output>(m, "Output", "What a batch row asks of the step.")
      .value("none", Output::none)
      .value("logits", Output::logits)
      .value("sample", Output::sample)
      .value("propose", Output::propose)
      .value("verify", Output::verify);
  py::class_<RowToken>(m, "RowToken", "A row's token: an id, Batch.SAMPLED or Batch.follow(seq).")
      .def_property_readonly(
          "source",
          [](const RowToken& t) {
            return t.from == TokenFrom::id ? "id" : t.from == TokenFrom::sampled ? "sampled" : "followed";
          })
      .def_readonly("value", &RowToken::value)
      .def("__eq__", [](const RowToken& a, const RowToken& b) { return a == b; })
      .def("__repr__", [](const RowToken& t) {
        return t.from == TokenFrom::id        ? std::to_string(t.value)
               : t.from == TokenFrom::sampled ? std::string("Batch.SAMPLED")
                                              : "Batch.follow(" + std::to_string(t.value) + ")";
      });

  py::class_<Batch>(m, "Batch", "The rows (token, position, sequence, output) of one step.")
      .def(py::init([](int capacity) {
             if (capacity <= 0) invalid("Batch capacity must be > 0, not " + std::to_string(capacity));
             return Batch(capacity);
           }),
           py::arg("capacity"))
      .def_readonly_static("SAMPLED", &Batch::kSampled)
      .def_static("follow", &Batch::follow, py::arg("seq"))
      .def(
          "add",
          [](Batch& b, int32_t token, int32_t pos, int32_t seq, Output out) {
            return as<InvalidArgumentError>([&] { return b.add(token, pos, seq, out); });
          },
          py::arg("token"), py::arg("pos"), py::arg("seq"), py::arg("output") = Output::none,
          "Appends a row; returns its index. Raises ultra.InvalidArgument when the batch is full.")
      .def(
          "add",
          [](Batch& b, RowToken token, int32_t pos, int32_t seq, Output out) {
            return as<InvalidArgumentError>([&] { return b.add(token, pos, seq, out); });
          },
          py::arg("token"), py::arg("pos"), py::arg("seq"), py::arg("output") = Output::none)
      .def(
          "add_sequence",
          [](Batch& b, const std::vector<int32_t>& tokens, int32_t pos0, int32_t seq, Output last) {
            if (b.size() + (int)tokens.size() > b.capacity())
              invalid("Batch.add_sequence: " + std::to_string(tokens.size()) + " rows do not fit (" +
                      std::to_string(b.size()) + " of " + std::to_string(b.capacity()) + " taken)");
            as<InvalidArgumentError>([&] { b.add_sequence(tokens, pos0, seq, last); });
          },
          py::arg("tokens"), py::arg("pos0"), py::arg("seq"), py::arg("last") = Output::none,
          "Appends tokens at positions pos0, pos0+1, ... of seq; `last` is the output of the last row.")
      .def("clear", &Batch::clear)
      .def_property_readonly("capacity", &Batch::capacity)
      .def("__len__", &Batch::size)
      .def(
          "token", [](const Batch& b, int row) { return check_row(b, row), b.token(row); }, py::arg("row"))
      .def(
          "pos", [](const Batch& b, int row) { return check_row(b, row), b.pos(row); }, py::arg("row"))
      .def(
          "seq", [](const Batch& b, int row) { return check_row(b, row), b.seq(row); }, py::arg("row"))
      .def(
          "output", [](const Batch& b, int row) { return check_row(b, row), b.output(row); }, py::arg("row"));
}

void bind_context(py::module_& m) {
  py::class_<SeqSnapshot>(m, "SeqSnapshot", "A sequence's length and sampler settings (Context.snapshot).")
      .def_readonly("n_tokens", &SeqSnapshot::n_tokens)
      .def_readonly("sampling", &SeqSnapshot::sampling);

  py::class_<PyContext>(m, "Context",
                        "The KV cache of n_slots sequences and one step function (include/ultra/context.h). "
                        "One thread at a time.")
      .def(
          py::init([](const Model& model, int n_ctx, int n_slots, int n_batch, int n_outputs, int threads,
                      const std::string& device, const std::string& kv_type, size_t mem_limit) {
            ContextParams p;
            p.backend = parse_device(device);
            p.kv_type =
                parse_kv(kv_type.empty() ? (p.backend == BackendKind::cuda ? "f16" : "f32") : kv_type);
            for (auto [v, name] : {std::pair{n_ctx, "n_ctx"}, {threads, "threads"}, {n_outputs, "n_outputs"}})
              if (v < 0) invalid(std::string(name) + " must be >= 0, not " + std::to_string(v));
            for (auto [v, name] : {std::pair{n_slots, "n_slots"}, {n_batch, "n_batch"}})
              if (v < 1) invalid(std::string(name) + " must be >= 1, not " + std::to_string(v));
            p.n_ctx = n_ctx;
            p.n_slots = n_slots;
            p.n_batch = n_batch;
            p.n_outputs = n_outputs;
            p.n_threads = threads;
            p.mem_limit = mem_limit;
            py::gil_scoped_release nogil;
            return std::make_unique<PyContext>(as<InvalidArgumentError>([&] { return Context(model, p); }));
          }),
          py::arg("model"), py::kw_only(), py::arg("n_ctx") = 0, py::arg("n_slots") = 1,
          py::arg("n_batch") = 512, py::arg("n_outputs") = 0, py::arg("threads") = 0,
          py::arg("device") = "cpu", py::arg("kv_type") = "", py::arg("mem_limit") = (size_t)0,
          "n_ctx: tokens per sequence (0: the model's, at most 4096); n_slots: sequences held at once; "
          "n_outputs: most output rows per step (0: n_slots); threads: CPU threads (0: all); device: "
          "'cpu' or 'cuda'; kv_type: 'f32', 'f16', 'bf16' ('': f32 on cpu, f16 on cuda); mem_limit: bytes.")
      .def_property_readonly("n_ctx", [](const PyContext& c) { return c.ctx.params().n_ctx; })
      .def_property_readonly("n_slots", [](const PyContext& c) { return c.ctx.params().n_slots; })
      .def_property_readonly("n_batch", [](const PyContext& c) { return c.ctx.params().n_batch; })
      .def_property_readonly("n_outputs", [](const PyContext& c) { return c.ctx.params().n_outputs; })
      .def_property_readonly("threads", [](const PyContext& c) { return c.ctx.params().n_threads; })
      .def_property_readonly(
          "device",
          [](const PyContext& c) { return c.ctx.params().backend == BackendKind::cuda ? "cuda" : "cpu"; })
      .def_property_readonly("n_sample_vocab", [](const PyContext& c) { return c.ctx.n_sample_vocab(); })
      .def_property_readonly("backend", [](const PyContext& c) { return c.ctx.backend_description(); })
      .def_property_readonly("model", [](const PyContext& c) { return c.ctx.model(); })
      .def_property_readonly("warnings",
                             [](const PyContext& c) {
                               return std::vector<std::string>(c.ctx.warnings().begin(),
                                                               c.ctx.warnings().end());
                             })
      .def_property_readonly("footprint",
                             [](const PyContext& c) {
                               const Footprint f = c.ctx.footprint();
                               py::dict d;
                               d["weights"] = f.weights;
                               d["kv"] = f.kv;
                               d["scratch"] = f.scratch;
                               return d;
                             })
      .def_property_readonly("stats",
                             [](const PyContext& c) {
                               const StepStats& s = c.ctx.stats();
                               py::dict d;
                               d["forward_ms"] = s.forward_ms;
                               d["sample_ms"] = s.sample_ms;
                               d["n_steps"] = s.n_steps;
                               d["n_rows"] = s.n_rows;
                               d["n_sampled"] = s.n_sampled;
                               return d;
                             })
      .def(
          "seq_len", [](PyContext& c, int seq) { return guarded(c, [&] { return c.ctx.seq_len(seq); }); },
          py::arg("seq"))
      .def(
          "seq_tokens",
          [](PyContext& c, int seq) {
            return guarded(c, [&] {
              auto t = c.ctx.seq_tokens(seq);
              return std::vector<int32_t>(t.begin(), t.end());
            });
          },
          py::arg("seq"), "The tokens now in the sequence's cache, by position.")
      .def(
          "crop", [](PyContext& c, int seq, int n) { guarded(c, [&] { c.ctx.crop(seq, n); }); },
          py::arg("seq"), py::arg("n"), "Keeps positions [0, n) of seq; O(1).")
      .def(
          "clear", [](PyContext& c, int seq) { guarded(c, [&] { c.ctx.clear(seq); }); }, py::arg("seq"))
      .def(
          "set_sampling",
          [](PyContext& c, int seq, const SamplingParams& p) {
            guarded(c, [&] { c.ctx.set_sampling(seq, p); });
          },
          py::arg("seq"), py::arg("params"))
      .def(
          "sampling", [](PyContext& c, int seq) { return guarded(c, [&] { return c.ctx.sampling(seq); }); },
          py::arg("seq"))
      .def(
          "snapshot", [](PyContext& c, int seq) { return guarded(c, [&] { return c.ctx.snapshot(seq); }); },
          py::arg("seq"))
      .def(
          "restore",
          [](PyContext& c, int seq, const SeqSnapshot& s) { guarded(c, [&] { c.ctx.restore(seq, s); }); },
          py::arg("seq"), py::arg("snapshot"))
      .def(
          "step", [](PyContext& c, const Batch& b) { released(c, [&] { c.ctx.step(b); }); }, py::arg("batch"),
          "Runs one step over the batch's rows (GIL released). Raises ultra.InvalidArgument naming the row "
          "and "
          "field of a bad batch; then nothing has changed.")
      .def(
          "submit", [](PyContext& c, const Batch& b) { released(c, [&] { c.ctx.submit(b); }); },
          py::arg("batch"))
      .def("wait", [](PyContext& c) { released(c, [&] { c.ctx.wait(); }); })
      .def_property_readonly("n_queued", [](const PyContext& c) { return c.ctx.n_queued(); })
      .def(
          "sampled", [](PyContext& c, int row) { return guarded(c, [&] { return c.ctx.sampled(row); }); },
          py::arg("row"), "The token the last step sampled for this row (Output.sample rows).")
      .def(
          "logprob", [](PyContext& c, int row) { return guarded(c, [&] { return c.ctx.logprob(row); }); },
          py::arg("row"))
      .def(
          "top_logprobs",
          [](PyContext& c, int row) {
            return guarded(c, [&] {
              std::vector<std::pair<int32_t, float>> out;
              for (const TokenLogprob& t : c.ctx.top_logprobs(row)) out.emplace_back(t.token, t.logprob);
              return out;
            });
          },
          py::arg("row"), "[(token, logprob)] best first (the sampler's n_probs).")
      .def(
          "logits",
          [](py::object self, int row) {
            PyContext& c = self.cast<PyContext&>();
            const std::span<const float> l = guarded(c, [&] { return c.ctx.logits(row); });
            py::array_t<float> a({(py::ssize_t)l.size()}, {(py::ssize_t)sizeof(float)}, l.data(), self);
            py::detail::array_proxy(a.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
            return a;
          },
          py::arg("row"),
          "The row's logits, float32[n_vocab], a read-only view of the context's buffer (no copy): valid "
          "until the context's next step; copy it (np.array(x)) to keep it.")
      .def(
          "sampled_rows",
          [](PyContext& c, const std::vector<int>& rows) {
            return guarded(c, [&] {
              py::array_t<int32_t> out((py::ssize_t)rows.size());
              int32_t* o = out.mutable_data();
              for (size_t i = 0; i < rows.size(); ++i) o[i] = c.ctx.sampled(rows[i]);
              return out;
            });
          },
          py::arg("rows"), "sampled(row) of several rows in one call (int32 array).");
}

// on_token for the C++ loops: calls the Python callable (GIL held for the call), which returns False to stop
// (None or anything true goes on). A Python exception in it (KeyboardInterrupt included) ends the loop and
// propagates to the caller.
OnToken python_on_token(const py::object& fn) {
  if (fn.is_none()) return nullptr;
  return [fn](int32_t tok, Context&, int) {
    py::gil_scoped_acquire gil;
    py::object r = fn(tok);
    return r.is_none() || r.cast<bool>();
  };
}

py::dict result_dict(const GenerateResult& r) {
  py::dict d;
  d["prompt_ms"] = r.prompt_ms;
  d["n_prompt"] = r.n_prompt;
  d["eval_ms"] = r.eval_ms;
  d["n_eval"] = r.n_eval;
  d["sample_ms"] = r.sample_ms;
  d["n_generated"] = r.n_generated;
  d["stopped_eog"] = r.stopped_eog;
  d["context_full"] = r.context_full;
  d["stopped_by_caller"] = r.stopped_by_caller;
  return d;
}

void bind_generate(py::module_& m) {
  m.def(
      "generate",
      [](PyContext& c, const std::vector<int32_t>& prompt, int seq, int n_predict, bool ignore_eos,
         const py::object& on_token) {
        GenerateParams gp;
        gp.seq = seq;
        gp.n_predict = n_predict;
        gp.ignore_eos = ignore_eos;
        const OnToken cb = python_on_token(on_token);
        const GenerateResult r = released(c, [&] { return generate(c.ctx, prompt, gp, cb); });
        return result_dict(r);
      },
      py::arg("ctx"), py::arg("prompt"), py::kw_only(), py::arg("seq") = 0, py::arg("n_predict") = 128,
      py::arg("ignore_eos") = false, py::arg("on_token") = py::none(),
      "The C++ generation loop (include/ultra/generate.h) on sequence seq, with the sequence's sampler "
      "(Context.set_sampling); on_token(token) -> False stops. Returns the timings and how it stopped.");
  m.def(
      "generate_speculative",
      [](PyContext& target, PyContext* draft, const std::vector<int32_t>& prompt, int seq, int n_predict,
         bool ignore_eos, int n_draft, int n_draft_min, float p_min, int lookup, int draft_seq,
         const py::object& on_token) {
        GenerateParams gp;
        gp.seq = seq;
        gp.n_predict = n_predict;
        gp.ignore_eos = ignore_eos;
        SpeculativeParams sp;
        sp.n_draft = n_draft;
        sp.n_draft_min = n_draft_min;
        sp.p_min = p_min;
        sp.lookup_ngram = lookup;
        sp.draft_seq = draft_seq;
        if (draft == &target) invalid("generate_speculative: the draft context is the target context");
        const OnToken cb = python_on_token(on_token);
        SpeculativeStats st;
        std::optional<Busy> draft_busy;
        if (draft) draft_busy.emplace(*draft);
        const GenerateResult r = released(target, [&] {
          return generate_speculative(target.ctx, draft ? &draft->ctx : nullptr, prompt, gp, sp, cb, &st);
        });
        py::dict d = result_dict(r);
        d["rounds"] = st.rounds;
        d["drafted"] = st.drafted;
        d["accepted"] = st.accepted;
        d["from_lookup"] = st.from_lookup;
        d["plain_steps"] = st.plain_steps;
        d["draft_ms"] = st.draft_ms;
        d["verify_ms"] = st.verify_ms;
        return d;
      },
      py::arg("target"), py::arg("draft"), py::arg("prompt"), py::kw_only(), py::arg("seq") = 0,
      py::arg("n_predict") = 128, py::arg("ignore_eos") = false, py::arg("n_draft") = 8,
      py::arg("n_draft_min") = 0, py::arg("p_min") = 0.0f, py::arg("lookup") = 0, py::arg("draft_seq") = 0,
      py::arg("on_token") = py::none(),
      "generate() with speculative decoding (include/ultra/speculative.h): draft (a Context of a draft "
      "model, "
      "or None) and/or prompt lookup (lookup > 0). The target needs n_outputs >= n_draft + 1.");
  m.def(
      "perplexity",
      [](PyContext& c, const std::vector<int32_t>& tokens, int n_window, bool all_positions, int32_t bos,
         int max_windows, bool allow_short, int seq) {
        PerplexityParams p;
        p.n_window = n_window;
        p.mode = all_positions ? PerplexityParams::Mode::AllPositions : PerplexityParams::Mode::SecondHalf;
        p.bos = bos;
        p.max_windows = max_windows;
        p.allow_short = allow_short;
        p.seq = seq;
        const PerplexityResult r = released(c, [&] { return perplexity(c.ctx, tokens, p); });
        py::dict d;
        d["ppl"] = r.ppl;
        d["ppl_err"] = r.ppl_err;
        d["mean_nll"] = r.mean_nll;
        d["n_scored"] = r.n_scored;
        d["n_windows"] = r.n_windows;
        d["n_window"] = r.n_window;
        d["n_dropped"] = r.n_dropped;
        d["running_ppl"] = r.running_ppl;
        return d;
      },
      py::arg("ctx"), py::arg("tokens"), py::kw_only(), py::arg("n_window") = 512,
      py::arg("all_positions") = false, py::arg("bos") = -1, py::arg("max_windows") = -1,
      py::arg("allow_short") = true, py::arg("seq") = 0,
      "llama.cpp's perplexity (include/ultra/perplexity.h) of the tokens in windows of n_window, as `ultra "
      "perplexity` computes it; the context needs n_ctx >= n_window and n_outputs >= min(n_window, "
      "n_batch).");
  m.def(
      "check_draft_compatible",
      [](const Model& target, const Model& draft) {
        as<InvalidArgumentError>([&] { check_draft_compatible(target, draft); });
      },
      py::arg("target"), py::arg("draft"));
}

void bind_chat(py::module_& m) {
  py::class_<ChatFormatter>(m, "ChatFormatter",
                            "Chat messages -> prompt, exactly as `ultra serve` renders /v1/chat/completions "
                            "(the model's template or the given one, else the fallback format).")
      .def(py::init([](const Model& model, const std::string& tmpl) {
             return as<InvalidArgumentError>([&] { return ChatFormatter(model, tmpl); });
           }),
           py::arg("model"), py::arg("template") = "")
      .def(
          "render",
          [](const ChatFormatter& f, std::string_view messages_json, bool agp, std::string_view kwargs_json) {
            return utf8(as<InvalidArgumentError>([&] { return f.render(messages_json, agp, kwargs_json); }));
          },
          py::arg("messages_json"), py::arg("add_generation_prompt") = true, py::arg("kwargs_json") = "{}")
      .def(
          "encode",
          [](const ChatFormatter& f, std::string_view messages_json, bool agp, bool allow_special,
             std::string_view kwargs_json) {
            return as<InvalidArgumentError>(
                [&] { return f.encode(messages_json, agp, allow_special, kwargs_json); });
          },
          py::arg("messages_json"), py::arg("add_generation_prompt") = true,
          py::arg("allow_special_in_content") = false, py::arg("kwargs_json") = "{}")
      .def_property_readonly("has_template", &ChatFormatter::has_template);

  py::class_<StopStrings>(m, "StopStrings", "Stop strings over streamed text, held back as the server does.")
      .def(py::init<std::vector<std::string>>(), py::arg("stops"))
      .def(
          "push", [](StopStrings& s, std::string_view text) { return utf8(s.push(text)); }, py::arg("text"))
      .def("flush", [](StopStrings& s) { return utf8(s.flush()); })
      .def_property_readonly("stopped", &StopStrings::stopped);
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "ultra's public C++ API (include/ultra) as Python classes; see the `ultra` package for LLM.";
  bind_errors(m);
  bind_sampling(m);
  bind_model(m);
  bind_batch(m);
  bind_context(m);
  bind_generate(m);
  bind_chat(m);
}
