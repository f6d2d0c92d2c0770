// Chat templates: the Jinja template a model ships (GGUF `tokenizer.chat_template`, HF
// tokenizer_config.json `chat_template`) run by ultra's own interpreter of the Jinja subset real templates
// use, in the environment HF transformers gives apply_chat_template: trim_blocks and lstrip_blocks,
// loop controls, `tojson` as json.dumps(x, ensure_ascii=False, ...), raise_exception(msg), strftime_now(fmt),
// and the variables messages, add_generation_prompt, bos_token, eos_token plus any extra keyword variables
// (vLLM's / llama.cpp's chat_template_kwargs).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

namespace ultra {

struct ChatTemplateOptions {
  std::string bos_token;  // the model's BOS and EOS strings (empty when it has none)
  std::string eos_token;
  // The time strftime_now() formats: 0 = now. Tests pin it.
  std::time_t now = 0;
};

// What one render may spend besides the per-value limits (16 MiB per string or output, 64 nested macro
// calls, 5M steps). A template comes with the model file or with a request (`chat_template`), so a render
// is bounded in memory, CPU and time. Real templates render in microseconds and well under 1 MiB; the
// defaults leave them a margin of several hundred times (tests/test_chat_template.cpp measures it).
struct RenderBudget {
  size_t max_bytes = 64u << 20;  // total bytes of strings/lists/dicts the render may allocate (the messages'
                                 // own conversion included); freed memory is not given back
  // Steps weighted by the bytes they touch: one unit per evaluated node or loop iteration, plus one per
  // 64 bytes read or written (copying, comparing, searching, appending to the output). 2^24 units is
  // 1 GiB touched or 16M steps (the 5M step limit comes first): a fraction of a second of CPU.
  uint64_t max_work = uint64_t(1) << 24;
  double max_seconds = 0.25;                  // wall time, from the start of apply()
  const std::atomic<bool>* cancel = nullptr;  // when set to true by another thread, the render stops
};

class ChatTemplate {
 public:
  // Parses the template; throws ultra::Error naming the construct and its line when the template uses
  // something the interpreter does not support or is not valid Jinja.
  ChatTemplate(const std::string& source, ChatTemplateOptions options = {});
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  // Renders messages (a JSON array of {"role", "content", ...} objects). extra: a JSON object whose members
  // become template variables (they override nothing of the above but add to it). Throws ultra::Error with
  // the template's message on raise_exception(), and on a runtime error (naming it and the line).
  // A render over its budget or cancelled throws ultra::Error saying which ("chat template render exceeded
  // its time budget (0.25 s)", "... its memory budget ...", "... its work budget ...", "chat template render
  // was cancelled"); the clock and the cancel flag are read every few thousand units of work (well under a
  // millisecond of CPU).
  std::string apply(const nlohmann::json& messages, bool add_generation_prompt,
                    const nlohmann::json& extra = nlohmann::json::object(),
                    const RenderBudget& budget = {}) const;

  const std::string& source() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ultra
