// The built-in chat templates (builtin_templates.h). Every line of a source starts and ends with a
// whitespace-trimming tag ({%- -%}, {{- -}}), so the layout here puts nothing into the output; '\n' inside a
// Jinja string literal is the only newline a template writes.
#include "chat/builtin_templates.h"

#include <array>

namespace ultra {

namespace {

// ChatML: Qwen2 / Qwen2.5, Hermes, Yi, ... (Qwen2.5's template with a system message renders the same).
constexpr std::string_view kChatml = R"JINJA(
{%- for message in messages -%}
{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
)JINJA";

// meta-llama/Llama-2-*-chat-hf: the system message inside the first [INST] between <<SYS>> markers, BOS
// before every user turn, EOS after every reply.
constexpr std::string_view kLlama2 = R"JINJA(
{%- if messages and messages[0]['role'] == 'system' -%}
{%- set loop_messages = messages[1:] -%}
{%- set system_message = messages[0]['content'] -%}
{%- else -%}
{%- set loop_messages = messages -%}
{%- set system_message = false -%}
{%- endif -%}
{%- for message in loop_messages -%}
{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') -}}
{%- endif -%}
{%- if loop.index0 == 0 and system_message != false -%}
{%- set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] -%}
{%- else -%}
{%- set content = message['content'] -%}
{%- endif -%}
{%- if message['role'] == 'user' -%}
{{- bos_token + '[INST] ' + content.strip() + ' [/INST]' -}}
{%- elif message['role'] == 'assistant' -%}
{{- ' ' + content.strip() + ' ' + eos_token -}}
{%- endif -%}
{%- endfor -%}
)JINJA";

// meta-llama/Meta-Llama-3-8B-Instruct (Llama 3.1+ add a "Cutting Knowledge Date" preamble to the system
// message; otherwise the same).
constexpr std::string_view kLlama3 = R"JINJA(
{%- for message in messages -%}
{%- set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' -%}
{%- if loop.index0 == 0 -%}{%- set content = bos_token + content -%}{%- endif -%}
{{- content -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}{%- endif -%}
)JINJA";

// mistralai/Mistral-Nemo-Instruct-2407 (v3 tekken): the system message goes before the last user message.
constexpr std::string_view kMistralV3Tekken = R"JINJA(
{%- if messages and messages[0]['role'] == 'system' -%}
{%- set system_message = messages[0]['content'] -%}
{%- set loop_messages = messages[1:] -%}
{%- else -%}
{%- set loop_messages = messages -%}
{%- endif -%}
{{- bos_token -}}
{%- for message in loop_messages -%}
{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
{{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') -}}
{%- endif -%}
{%- if message['role'] == 'user' -%}
{%- if loop.last and system_message is defined -%}
{{- '[INST]' + system_message + '\n\n' + message['content'] + '[/INST]' -}}
{%- else -%}
{{- '[INST]' + message['content'] + '[/INST]' -}}
{%- endif -%}
{%- else -%}
{{- message['content'] + eos_token -}}
{%- endif -%}
{%- endfor -%}
)JINJA";

// mistralai/Mistral-Large-Instruct-2411 (v7): [SYSTEM_PROMPT] blocks, a space after each opening marker.
constexpr std::string_view kMistralV7 = R"JINJA(
{{- bos_token -}}
{%- for message in messages -%}
{%- if message['role'] == 'user' -%}
{{- '[INST] ' + message['content'] + '[/INST]' -}}
{%- elif message['role'] == 'system' -%}
{{- '[SYSTEM_PROMPT] ' + message['content'] + '[/SYSTEM_PROMPT]' -}}
{%- elif message['role'] == 'assistant' -%}
{{- ' ' + message['content'] + eos_token -}}
{%- else -%}
{{- raise_exception('Only user, system and assistant roles are supported!') -}}
{%- endif -%}
{%- endfor -%}
)JINJA";

// mistralai/Mistral-Small-3.1/3.2-24B-Instruct (v7 tekken): v7 without the spaces. (Their own templates add
// a long default system message when there is none.)
constexpr std::string_view kMistralV7Tekken = R"JINJA(
{{- bos_token -}}
{%- for message in messages -%}
{%- if message['role'] == 'user' -%}
{{- '[INST]' + message['content'] + '[/INST]' -}}
{%- elif message['role'] == 'system' -%}
{{- '[SYSTEM_PROMPT]' + message['content'] + '[/SYSTEM_PROMPT]' -}}
{%- elif message['role'] == 'assistant' -%}
{{- message['content'] + eos_token -}}
{%- else -%}
{{- raise_exception('Only user, system and assistant roles are supported!') -}}
{%- endif -%}
{%- endfor -%}
)JINJA";

// microsoft/Phi-3.5-mini-instruct (and Phi-3): EOS at the end when no generation prompt follows.
constexpr std::string_view kPhi3 = R"JINJA(
{%- for message in messages -%}
{%- if message['role'] == 'system' and message['content'] -%}
{{- '<|system|>\n' + message['content'] + '<|end|>\n' -}}
{%- elif message['role'] == 'user' -%}
{{- '<|user|>\n' + message['content'] + '<|end|>\n' -}}
{%- elif message['role'] == 'assistant' -%}
{{- '<|assistant|>\n' + message['content'] + '<|end|>\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|assistant|>\n' -}}{%- else -%}{{- eos_token -}}{%- endif -%}
)JINJA";

// google/gemma-3-*-it's text turns (Gemma 2's template is the same but refuses a system message; Gemma 3's
// puts it at the start of the first user turn, as does llama.cpp's "gemma").
constexpr std::string_view kGemma = R"JINJA(
{{- bos_token -}}
{%- if messages and messages[0]['role'] == 'system' -%}
{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
{%- set loop_messages = messages[1:] -%}
{%- else -%}
{%- set first_user_prefix = '' -%}
{%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') -}}
{%- endif -%}
{%- if message['role'] == 'assistant' -%}{%- set role = 'model' -%}{%- else -%}{%- set role = message['role'] -%}{%- endif -%}
{{- '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') + message['content'] | trim + '<end_of_turn>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<start_of_turn>model\n' -}}{%- endif -%}
)JINJA";

// HuggingFaceH4/zephyr-7b-beta.
constexpr std::string_view kZephyr = R"JINJA(
{%- for message in messages -%}
{%- if message['role'] in ['system', 'user', 'assistant'] -%}
{{- '<|' + message['role'] + '|>\n' + message['content'] + eos_token + '\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|assistant|>\n' -}}{%- endif -%}
)JINJA";

// lmsys Vicuna v1.1 as llama.cpp writes it (the model ships no template): USER: / ASSISTANT: lines.
constexpr std::string_view kVicuna = R"JINJA(
{%- for message in messages -%}
{%- if message['role'] == 'system' -%}
{{- message['content'] + '\n\n' -}}
{%- elif message['role'] == 'user' -%}
{{- 'USER: ' + message['content'] + '\n' -}}
{%- elif message['role'] == 'assistant' -%}
{{- 'ASSISTANT: ' + message['content'] + eos_token + '\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- 'ASSISTANT:' -}}{%- endif -%}
)JINJA";

// deepseek-ai/deepseek-coder-*-instruct: ### Instruction: / ### Response: sections.
constexpr std::string_view kDeepseek = R"JINJA(
{{- bos_token -}}
{%- for message in messages -%}
{%- if message['role'] == 'system' -%}
{{- message['content'] -}}
{%- elif message['role'] == 'user' -%}
{{- '### Instruction:\n' + message['content'] + '\n' -}}
{%- elif message['role'] == 'assistant' -%}
{{- '### Response:\n' + message['content'] + '\n<|EOT|>\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '### Response:\n' -}}{%- endif -%}
)JINJA";

// deepseek-ai/DeepSeek-V3 (and R1's turns, without R1's "<think>\n" after the generation prompt): the system
// message first, then <｜User｜> / <｜Assistant｜> turns; a reply's reasoning before </think> is dropped.
constexpr std::string_view kDeepseek3 = R"JINJA(
{%- set ns = namespace(system_prompt='') -%}
{%- for message in messages -%}
{%- if message['role'] == 'system' -%}{%- set ns.system_prompt = message['content'] -%}{%- endif -%}
{%- endfor -%}
{{- bos_token + ns.system_prompt -}}
{%- for message in messages -%}
{%- if message['role'] == 'user' -%}
{{- '<｜User｜>' + message['content'] -}}
{%- elif message['role'] == 'assistant' -%}
{%- set content = message['content'] -%}
{%- if '</think>' in content -%}{%- set content = content.split('</think>')[-1] -%}{%- endif -%}
{{- '<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<｜Assistant｜>' -}}{%- endif -%}
)JINJA";

// CohereForAI/c4ai-command-r-plus's default template (not its tool-use or RAG ones).
constexpr std::string_view kCommandR = R"JINJA(
{{- bos_token -}}
{%- if messages and messages[0]['role'] == 'system' -%}
{%- set loop_messages = messages[1:] -%}
{%- set system_message = messages[0]['content'] -%}
{%- else -%}
{%- set loop_messages = messages -%}
{%- set system_message = false -%}
{%- endif -%}
{%- if system_message != false -%}
{{- '<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>' + system_message + '<|END_OF_TURN_TOKEN|>' -}}
{%- endif -%}
{%- for message in loop_messages -%}
{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') -}}
{%- endif -%}
{%- if message['role'] == 'user' -%}
{{- '<|START_OF_TURN_TOKEN|><|USER_TOKEN|>' + message['content'].strip() + '<|END_OF_TURN_TOKEN|>' -}}
{%- elif message['role'] == 'assistant' -%}
{{- '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' + message['content'].strip() + '<|END_OF_TURN_TOKEN|>' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' -}}{%- endif -%}
)JINJA";

// ibm-granite/granite-3.x-instruct's turns (their own templates add a dated default system message when
// there is none, and tool / document sections).
constexpr std::string_view kGranite = R"JINJA(
{%- for message in messages -%}
{{- '<|start_of_role|>' + message['role'] + '<|end_of_role|>' + message['content'] + '<|end_of_text|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|start_of_role|>assistant<|end_of_role|>' -}}{%- endif -%}
)JINJA";

// RWKV World (llama.cpp's models/templates/llama-cpp-rwkv-world.jinja without its thinking switch).
constexpr std::string_view kRwkvWorld = R"JINJA(
{%- set ns = namespace(system_prompt='') -%}
{%- for message in messages -%}
{%- if message['role'] == 'system' -%}{%- set ns.system_prompt = message['content'] -%}{%- endif -%}
{%- endfor -%}
{{- bos_token -}}
{%- if ns.system_prompt != '' -%}{{- 'System: ' + ns.system_prompt + '\n\n' -}}{%- endif -%}
{%- for message in messages -%}
{%- if message['role'] == 'user' -%}
{{- 'User: ' + message['content'] | trim + '\n\n' -}}
{%- elif message['role'] == 'assistant' and message['content'] is not none -%}
{%- set content = message['content'] -%}
{%- if '</think>' in content -%}{%- set content = content.split('</think>')[-1] -%}{%- endif -%}
{{- 'Assistant: ' + content | trim + '\n\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- 'Assistant:' -}}{%- endif -%}
)JINJA";

constexpr std::array<BuiltinChatTemplate, 15> kBuiltins = {{
    {"chatml", "ChatML: Qwen2/2.5, Hermes, Yi", kChatml},
    {"llama2", "Llama 2 chat", kLlama2},
    {"llama3", "Llama 3", kLlama3},
    {"mistral-v3-tekken", "Mistral Nemo", kMistralV3Tekken},
    {"mistral-v7", "Mistral Large 2411", kMistralV7},
    {"mistral-v7-tekken", "Mistral Small 3.1/3.2", kMistralV7Tekken},
    {"phi3", "Phi-3, Phi-3.5", kPhi3},
    {"gemma", "Gemma 2/3", kGemma},
    {"zephyr", "Zephyr", kZephyr},
    {"vicuna", "Vicuna v1.1", kVicuna},
    {"deepseek", "DeepSeek Coder", kDeepseek},
    {"deepseek3", "DeepSeek V3, R1", kDeepseek3},
    {"command-r", "Command R/R+", kCommandR},
    {"granite", "Granite 3.x", kGranite},
    {"rwkv-world", "RWKV World", kRwkvWorld},
}};

}  // namespace

std::span<const BuiltinChatTemplate> builtin_chat_templates() {
  return kBuiltins;
}

const BuiltinChatTemplate* find_builtin_chat_template(std::string_view name) {
  for (const BuiltinChatTemplate& t : kBuiltins)
    if (t.name == name) return &t;
  return nullptr;
}

std::string builtin_chat_template_names() {
  std::string out;
  for (const BuiltinChatTemplate& t : kBuiltins) {
    if (!out.empty()) out += ", ";
    out += t.name;
  }
  return out;
}

}  // namespace ultra
