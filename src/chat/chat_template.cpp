// ChatTemplate: parse once, render per request (see chat_template.h).
#include "chat/chat_template.h"

#include "chat/jinja.h"
#include "core/error.h"

namespace ultra {

struct ChatTemplate::Impl {
  std::string source;
  ChatTemplateOptions options;
  jinja::Body body;
};

ChatTemplate::ChatTemplate(const std::string& source, ChatTemplateOptions options)
    : impl_(std::make_unique<Impl>()) {
  impl_->source = source;
  impl_->options = std::move(options);
  impl_->body = jinja::parse(jinja::lex(source));
}

ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

std::string ChatTemplate::apply(const nlohmann::json& messages, bool add_generation_prompt,
                                const nlohmann::json& extra, const RenderBudget& budget) const {
  if (!messages.is_array()) fail("chat template: messages must be a JSON array");
  if (!extra.is_null() && !extra.is_object()) fail("chat template: extra variables must be a JSON object");
  jinja::Globals g{impl_->options.bos_token, impl_->options.eos_token, int64_t(impl_->options.now)};
  jinja::Limits limits;
  limits.max_bytes = budget.max_bytes;
  limits.max_work = budget.max_work;
  limits.max_seconds = budget.max_seconds;
  limits.cancel = budget.cancel;
  return jinja::render(impl_->body, g, messages, add_generation_prompt, extra, limits);
}

const std::string& ChatTemplate::source() const {
  return impl_->source;
}

}  // namespace ultra
