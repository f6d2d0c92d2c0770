// ultra chat: an interactive terminal chat on the model's chat template (the server's template code), with
// the conversation's KV cache kept between turns.
//
// Each turn renders the whole conversation (system, user and assistant messages, then the generation
// prompt) and tokenizes it; the tokens the cache already holds are compared with it and only the part after
// their common prefix is prefilled. With the usual templates the previous rendering plus the previous reply
// is a prefix of the next rendering, so a turn prefills only the new message (and the reply's tokens where
// re-tokenizing its text gives other tokens); when it is not, the cache is cropped to whatever prefix is
// common, which is always correct (a KV entry depends only on the tokens up to it).
//
// Input is read line by line from stdin, so the chat is scriptable (`printf 'hi\nmore\n' | ultra chat`).
// Ctrl-C while a reply is generated stops the reply (the partial reply stays in the conversation); Ctrl-C at
// the prompt, or a second Ctrl-C before the first one was handled, or EOF, exits.
#include <errno.h>
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>

#include "chat/chat_template.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "server/chat.h"
#include "server/reasoning.h"

namespace ultra::cli {

namespace {

using json = nlohmann::json;

volatile sig_atomic_t g_interrupted = 0;

void on_sigint(int) {
  if (g_interrupted) _exit(130);  // a second Ctrl-C before the first was noticed: the program is stuck
  g_interrupted = 1;
}

// Lines of stdin through read(2), so that Ctrl-C (a handler without SA_RESTART) interrupts the wait.
class LineReader {
 public:
  // false at EOF (with no partial line left) or when interrupted.
  bool next(std::string& line) {
    for (;;) {
      const size_t nl = buf_.find('\n');
      if (nl != std::string::npos) {
        line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        if (!line.empty() && line.back() == '\r') line.pop_back();
        return true;
      }
      if (eof_) {
        if (buf_.empty()) return false;
        line = std::move(buf_);
        buf_.clear();
        return true;
      }
      if (g_interrupted) return false;  // Ctrl-C at the prompt (or after the last reply ended)
      char tmp[4096];
      const ssize_t n = read(STDIN_FILENO, tmp, sizeof tmp);
      if (n < 0 && errno == EINTR) {
        if (g_interrupted) return false;
        continue;
      }
      if (n <= 0) {
        eof_ = true;
        continue;
      }
      buf_.append(tmp, (size_t)n);
    }
  }

 private:
  std::string buf_;
  bool eof_ = false;
};

// "\n", "\t", "\\" in a --stop value become the characters they name.
std::string unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) {
      out += s[i];
      continue;
    }
    const char c = s[++i];
    out += c == 'n' ? '\n' : c == 't' ? '\t' : c == 'r' ? '\r' : c;
  }
  return out;
}

// Throws ultra::Error when standard output cannot be written (the chat ends with an error, exit 1).
void write_out(std::string_view s) {
  if (!s.empty()) write_stdout(s, /*flush=*/true);
}

struct Turn {
  int n_prompt = 0, n_cached = 0, n_prefilled = 0, n_generated = 0;
  double prefill_ms = 0, generate_ms = 0;
  const char* end = "";   // eog, stop, length, context, interrupted
  std::string reply;      // the answer's text
  std::string reasoning;  // the reasoning's (a reasoning model's template)
};

}  // namespace

int cmd_chat(int argc, char** argv) {
  CLI::App app{"ultra chat: an interactive chat in the terminal on the model's chat template", "ultra chat"};
  ModelFlags mf;
  mf.add(app);
  SamplingParams sp;
  int64_t seed = -1;
  add_sampling_flags(app, sp, seed);
  GrammarFlags grammar_flags;
  add_grammar_flags(app, grammar_flags);
  std::string system_prompt, template_file;
  std::vector<std::string> stops;
  int n_predict = -1;
  bool verbose = false, no_cache = false;
  app.add_option("--system", system_prompt, "a system message that starts the conversation");
  app.add_option("--chat-template", template_file, chat_template_help())->type_name("FILE|NAME");
  app.add_option(
         "-n,--n-predict", n_predict,
         "most tokens per reply (-1: until the model ends it; 0: none, as run -n 0: the message is only "
         "prefilled)")
      ->capture_default_str()
      ->check(CLI::Range(-1, 1 << 24));
  app.add_option("--stop", stops,
                 "end a reply at this text (repeatable; \\n and \\t are escapes). Default with the bundled "
                 "model: a blank line, the end of a speech; --stop '' for none")
      ->allow_extra_args(false);
  app.add_flag("--verbose", verbose, "after each reply, print its token counts and timings to stderr");
  app.add_flag("--no-cache-prompt", no_cache,
               "prefill the whole conversation every turn instead of reusing the cache's common prefix");
  bool allow_special = false;
  app.add_flag(
      "--allow-special-in-content", allow_special,
      "parse special-token text (e.g. <|im_end|>) in messages as control tokens (default: plain text)");
  std::string reasoning_format = "auto";
  app.add_option(
         "--reasoning-format", reasoning_format,
         "auto: a reasoning model's thinking (<think>...</think>, gpt-oss's analysis channel) is shown "
         "dimmed and kept out of the reply's text in the conversation; none: the output as it is")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "none"}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  const bool bundled = mf.model.empty() && (!mf.model_opt || mf.model_opt->count() == 0);
  mf.resolve_model();
  resolve_sampling(sp, seed);
  const std::string gbnf = resolve_grammar(grammar_flags);  // each reply follows it
  for (std::string& s : stops) s = unescape(s);
  std::erase_if(stops, [](const std::string& s) { return s.empty(); });
  // The bundled play-script model never writes an end-of-text token: a speech ends at a blank line.
  if (bundled && !app.count("--stop")) stops = {"\n\n"};

  // --chat-template before the model: a bad name fails at once.
  const bool own_template = app.count("--chat-template") > 0;
  std::string template_label;
  const std::string own_source = own_template ? chat_template_from_arg(template_file, &template_label) : "";

  const Model model = Model::load(mf.model, mf.load_params());
  const Tokenizer* tok = model.tokenizer();
  if (!tok) fail("{}: this model has no tokenizer, which a chat needs", model.info().path);
  std::optional<ChatTemplate> tmpl;
  const std::string& source = own_template ? own_source : model.chat_template();
  const char* template_from = "fallback";
  if (!source.empty()) {
    try {
      tmpl.emplace(source, server::chat_template_options(model));
    } catch (const Error& e) {
      fail("{}'s chat template cannot be run: {} (give one with --chat-template FILE or NAME)",
           own_template ? template_label : model.info().path, e.what());
    }
    template_from = own_template ? template_label.c_str() : "the model's";
  }
  // The template's reasoning syntax (server/reasoning.h); harmony's markers are control tokens, kept as text
  // for the splitter.
  const server::ReasoningSyntax reasoning =
      reasoning_format == "none" ? server::ReasoningSyntax::None : server::detect_reasoning(source);
  const bool dim = isatty(STDOUT_FILENO);
  ContextParams cp = mf.context_params();
  cp.n_slots = 1;
  Context ctx(model, cp);
  print_warnings(ctx);
  ctx.set_sampling(0, sp);
  const int n_ctx = ctx.params().n_ctx;
  fmt::print(stderr,
             "ultra chat: {} (context {} tokens, chat template: {}). /clear starts over, /exit or EOF quits; "
             "Ctrl-C stops a reply.\n",
             model.info().path, n_ctx, tmpl ? template_from : "none, the built-in fallback format");

  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: a read() at the prompt returns EINTR
  sigaction(SIGINT, &sa, nullptr);

  json messages = json::array();
  auto reset = [&] {
    messages = json::array();
    if (!system_prompt.empty()) messages.push_back({{"role", "system"}, {"content", system_prompt}});
  };
  reset();
  const int reserve = n_predict >= 0 ? std::min(n_predict, n_ctx / 2) : n_ctx / 4;  // room kept for a reply
  const bool interactive = isatty(STDIN_FILENO);
  Batch batch(ctx.params().n_batch);
  LineReader in;
  std::string line;
  int n_turn = 0;
  for (;;) {
    if (interactive) write_out("> ");
    if (!in.next(line)) break;
    if (line.empty()) continue;
    if (line == "/exit" || line == "/quit") break;
    if (line == "/clear") {
      reset();
      fmt::print(stderr, "(conversation cleared)\n");
      continue;
    }
    if (line == "/help" || (line[0] == '/' && line.find(' ') == std::string::npos)) {
      if (line != "/help") fmt::print(stderr, "unknown command {}; ", line);
      fmt::print(stderr, "commands: /clear (start over), /exit (quit)\n");
      continue;
    }

    // The conversation's tokens; the oldest turns are forgotten while it leaves no room for a reply.
    messages.push_back({{"role", "user"}, {"content", line}});
    std::vector<int32_t> prompt;
    int n_forgotten = 0;
    bool refused = false;
    for (;;) {
      try {
        prompt = server::encode_chat(
            *tok, messages,
            [&](const json& m) { return server::render_chat(tmpl ? &*tmpl : nullptr, m, true); },
            allow_special);
      } catch (const Error& e) {
        fmt::print(stderr, "error: the chat template refused the conversation: {}\n", e.what());
        refused = true;
        break;
      }
      if ((int)prompt.size() + reserve <= n_ctx) break;
      const size_t first = !messages.empty() && messages[0]["role"] == "system" ? 1 : 0;
      if (messages.size() - first <= 1) {
        fmt::print(stderr,
                   "error: the message is too long: {} prompt tokens, and the context holds {} (-c)\n",
                   prompt.size(), n_ctx);
        refused = true;
        break;
      }
      // Forget the oldest message, and the replies before the next user message with it.
      do {
        messages.erase(first);
        ++n_forgotten;
      } while (messages.size() - first > 1 && messages[first]["role"] != "user");
    }
    if (refused) {
      messages.erase(messages.size() - 1);
      continue;
    }
    if (n_forgotten) fmt::print(stderr, "(context full: the oldest {} message(s) forgotten)\n", n_forgotten);

    // Reuse the cache's common prefix; at least the last prompt token is prefilled (it gives the sample).
    Turn t;
    ++n_turn;
    t.n_prompt = (int)prompt.size();
    const std::span<const int32_t> cached = ctx.seq_tokens(0);
    size_t keep = 0;
    if (!no_cache)
      while (keep < cached.size() && keep + 1 < prompt.size() && cached[keep] == prompt[keep]) ++keep;
    ctx.crop(0, (int)keep);
    if (!gbnf.empty()) ctx.set_grammar(0, gbnf);  // afresh: the reply starts at the prompt's last row
    t.n_cached = (int)keep;
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t i = keep; i < prompt.size() && !g_interrupted;) {
      const size_t n = std::min(prompt.size() - i, (size_t)batch.capacity());
      const bool last = i + n == prompt.size();
      batch.clear();
      batch.add_sequence(std::span(prompt).subspan(i, n), (int32_t)i, 0,
                         last ? Output::sample : Output::none);
      ctx.step(batch);
      i += n;
      t.n_prefilled += (int)n;
    }
    t.prefill_ms = ms_since(t0);

    const auto t1 = std::chrono::steady_clock::now();
    if (g_interrupted) {
      g_interrupted = 0;  // this Ctrl-C stopped the reply; the next one at the prompt exits
      t.end = "interrupted";
    } else if (n_predict == 0) {  // -n 0: nothing generated (the message stays in the cache)
      t.end = "length";
    } else {
      TextStream stream(*tok, /*skip_special=*/reasoning != server::ReasoningSyntax::Harmony);
      server::StopStrings stop(stops);
      server::ReasoningStream split(reasoning, server::prompt_opens_thinking(*tok, prompt));
      // The reasoning dimmed on a terminal, the answer as it is; the reply keeps the answer only.
      bool dimmed = false;
      auto show = [&](server::ReasoningSplit&& p) {
        if (!p.reasoning.empty()) {
          if (dim && !dimmed) write_out("\x1b[2m");
          dimmed = true;
          write_out(p.reasoning);
          t.reasoning += p.reasoning;
        }
        for (const server::ToolCall& c : p.calls) p.content += c.name + " " + c.arguments;
        if (!p.content.empty()) {
          if (dim && dimmed) write_out("\x1b[0m");
          if (dimmed) write_out("\n");
          dimmed = false;
          write_out(p.content);
          t.reply += p.content;
        }
      };
      int32_t next = ctx.sampled(batch.size() - 1);
      for (;;) {
        ++t.n_generated;
        if (model.is_eog(next)) {
          t.end = "eog";
          break;
        }
        show(split.push(stop.push(stream.push(next))));
        if (stop.stopped()) {
          t.end = "stop";
          break;
        }
        if (n_predict > 0 && t.n_generated >= n_predict) {
          t.end = "length";
          break;
        }
        if (ctx.seq_len(0) >= n_ctx) {
          t.end = "context";
          break;
        }
        if (g_interrupted) {
          g_interrupted = 0;
          t.end = "interrupted";
          break;
        }
        batch.clear();
        batch.add(next, ctx.seq_len(0), 0, Output::sample);
        ctx.step(batch);
        next = ctx.sampled(0);
      }
      if (!stop.stopped()) {
        std::string out = stop.push(stream.flush());
        if (!stop.stopped()) out += stop.flush();
        show(split.push(out));
      }
      show(split.finish());
      if (dim && dimmed) write_out("\x1b[0m");
    }
    t.generate_ms = ms_since(t1);
    write_out("\n");
    if (t.end == std::string_view("interrupted")) fmt::print(stderr, "(stopped)\n");
    if (t.end == std::string_view("context"))
      fmt::print(stderr, "(the context is full: the next turn forgets the oldest messages)\n");
    json reply = {{"role", "assistant"}, {"content", t.reply}};
    if (!t.reasoning.empty()) reply["reasoning_content"] = t.reasoning;
    if (!t.reasoning.empty() && reasoning == server::ReasoningSyntax::Harmony)
      reply["thinking"] = t.reasoning;  // gpt-oss's template reads it there
    messages.push_back(std::move(reply));
    if (verbose)
      fmt::print(
          stderr,
          "[turn {}] prompt {} tokens: {} cached, {} prefilled ({:.1f} ms); reply {} tokens ({:.1f} ms, "
          "{:.1f} tokens/s), end: {}\n",
          n_turn, t.n_prompt, t.n_cached, t.n_prefilled, t.prefill_ms, t.n_generated, t.generate_ms,
          t.generate_ms > 0 ? 1e3 * t.n_generated / t.generate_ms : 0.0, t.end);
  }
  if (interactive) write_out("\n");
  return 0;
}

}  // namespace ultra::cli
