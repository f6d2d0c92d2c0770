#!/usr/bin/env python3
"""Reference renderings of tool-calling conversations by Python's jinja2, for ultra's tool-call tests.

    python3 tools/make_tool_fixtures.py -o tests/fixtures/templates/tool_renderings.json

Uses the templates already in tests/fixtures/templates and the environment of make_template_fixtures.py
(HF transformers' apply_chat_template: trim/lstrip blocks, loopcontrols, tojson, raise_exception,
strftime_now pinned to 2026-11-30). Each conversation holds a system and a user message, an assistant message
with tool_calls (arguments as the object a template expects, which is what ultra's prepare_tool_messages
makes of OpenAI's JSON-string arguments), the tool's result and, for some, the assistant's answer; the tools
are passed as the `tools` variable. The tools and the messages are rendered as ultra's server gets them: object
keys sorted (the server reads requests with sorted keys) and an assistant message's null content with tool
calls as "" (prepare_tool_messages; Qwen3's template cannot take null there). Output: {"jinja2", "tools", "conversations", "templates": {name: [{"conversation",
"output" | "error"}]}}.
"""
import argparse
import json
import os

import jinja2

from make_template_fixtures import environment

TEMPLATES = ["Qwen-Qwen2.5-7B-Instruct", "Qwen-Qwen3-0.6B", "NousResearch-Hermes-3-Llama-3.1-8B-tool_use",
             "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use", "meta-llama-Llama-3.1-8B-Instruct",
             "meta-llama-Llama-3.2-3B-Instruct", "meta-llama-Llama-3.3-70B-Instruct",
             "mistralai-Mistral-Nemo-Instruct-2407", "Mistral-Small-3.2-24B-Instruct-2506", "Qwen3-Coder",
             "Qwen3.5-4B", "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"]

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"type": "string", "enum": ["c", "f"]}},
                   "required": ["city"]}}}]

CALL = {"id": "abc123XYZ", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}}

CONVERSATIONS = [
    # 0: the call, its result, the generation prompt after it
    [{"role": "system", "content": "You are helpful."},
     {"role": "user", "content": "Weather in Paris?"},
     {"role": "assistant", "content": None, "tool_calls": [CALL]},
     {"role": "tool", "tool_call_id": "abc123XYZ", "content": "{\"temp\": 21}"}],
    # 1: the same and the answer, then a new question
    [{"role": "system", "content": "You are helpful."},
     {"role": "user", "content": "Weather in Paris?"},
     {"role": "assistant", "content": None, "tool_calls": [CALL]},
     {"role": "tool", "tool_call_id": "abc123XYZ", "content": "{\"temp\": 21}"},
     {"role": "assistant", "content": "It is 21 C."},
     {"role": "user", "content": "Thanks!"}],
]


def sorted_keys(x):
    return json.loads(json.dumps(x, sort_keys=True))


def prepared(conv):
    out = []
    for m in conv:
        m = dict(m)
        if m["role"] == "assistant" and m.get("tool_calls") and m.get("content") is None:
            m["content"] = ""
        out.append(m)
    return sorted_keys(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--templates", default="tests/fixtures/templates")
    ap.add_argument("-o", "--out", default="tests/fixtures/templates/tool_renderings.json")
    args = ap.parse_args()
    env = environment()
    result = {"jinja2": jinja2.__version__, "tools": TOOLS, "conversations": CONVERSATIONS, "templates": {}}
    for name in TEMPLATES:
        src = open(os.path.join(args.templates, name + ".jinja"), encoding="utf-8").read()
        tmpl = env.from_string(src)
        cases = []
        for i, conv in enumerate(CONVERSATIONS):
            case = {"conversation": i}
            try:
                case["output"] = tmpl.render(messages=prepared(conv), tools=sorted_keys(TOOLS), add_generation_prompt=True,
                                             bos_token="<BOS>", eos_token="<EOS>")
            except Exception as e:  # noqa: BLE001
                case["error"] = f"{type(e).__name__}: {e}"
            cases.append(case)
        result["templates"][name] = cases
        print(name, ["error" if "error" in c else len(c["output"]) for c in cases])
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f, ensure_ascii=False, indent=1)


if __name__ == "__main__":
    main()
