#!/usr/bin/env python3
"""Reference renderings of real chat templates by Python's jinja2, for ultra's Jinja interpreter tests.

    python3 tools/make_template_fixtures.py --templates /path/to/llama.cpp/models/templates \
        -o tests/fixtures/templates

The templates are llama.cpp's `models/templates/*.jinja` (the source bundle that the npm package
node-llama-cpp ships: `git clone node_modules/node-llama-cpp/llama/gitRelease.bundle`). Each is copied to
<out>/<name>.jinja and rendered for a fixed set of conversations, with add_generation_prompt off and on,
in the environment HF transformers uses for `apply_chat_template` (transformers' utils/chat_template_utils.py):
an ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the loopcontrols extension, a `tojson`
filter that is json.dumps(x, ensure_ascii=False, indent=..., separators=..., sort_keys=...), and the globals
raise_exception (raises a TemplateError with its message) and strftime_now. strftime_now is pinned to
2026-11-30 so that the renderings are reproducible (the interpreter under test takes the same fixed time).
Variables: messages, add_generation_prompt, bos_token "<BOS>", eos_token "<EOS>" (distinct markers, so a
double BOS shows), and nothing else (no tools, no documents).

<out>/renderings.json: {"templates": {name: {"sha256": ..., "cases": [{"conversation": i,
"add_generation_prompt": bool, "output": str} or {..., "error": str}]}}, "conversations": [...],
"jinja2": version}. A template whose every case fails under jinja2 is dropped (with the reason printed).
"""
import argparse
import datetime
import hashlib
import json
import os
import shutil

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

FIXED_NOW = datetime.datetime(2026, 11, 30, 12, 0, 0)

CONVERSATIONS = [
    # 0: one user turn
    [{"role": "user", "content": "Hello! Who are you?"}],
    # 1: a system message and a user turn
    [{"role": "system", "content": "You are a helpful assistant."},
     {"role": "user", "content": "What is 2 + 2?"}],
    # 2: several turns with a system message
    [{"role": "system", "content": "You answer in one short sentence."},
     {"role": "user", "content": "Name a colour."},
     {"role": "assistant", "content": "Blue."},
     {"role": "user", "content": "Another one, please."}],
    # 3: several turns without a system message, non-ASCII text and characters JSON escapes
    [{"role": "user", "content": "Traduis « bonjour » en 日本語, s'il te plaît."},
     {"role": "assistant", "content": "こんにちは — \"konnichiwa\"."},
     {"role": "user", "content": "Merci!\nEt « merci » ?"}],
]


class GenerationTag(jinja2.ext.Extension):
    """{% generation %} ... {% endgeneration %} (transformers' AssistantTracker, without the tracking): the
    body renders as is."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def environment():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return FIXED_NOW.strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--templates", required=True, help="llama.cpp's models/templates directory")
    ap.add_argument("-o", "--out", default="tests/fixtures/templates")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    env = environment()
    result = {"jinja2": jinja2.__version__, "now": FIXED_NOW.isoformat(), "bos_token": "<BOS>",
              "eos_token": "<EOS>", "conversations": CONVERSATIONS, "templates": {}}
    for fn in sorted(os.listdir(args.templates)):
        if not fn.endswith(".jinja"):
            continue
        name = fn[:-len(".jinja")]
        src = open(os.path.join(args.templates, fn), encoding="utf-8").read()
        try:
            tmpl = env.from_string(src)
        except Exception as e:  # noqa: BLE001
            print(f"dropped {name}: does not parse in jinja2: {e!r}")
            continue
        cases = []
        for i, conv in enumerate(CONVERSATIONS):
            for agp in (False, True):
                case = {"conversation": i, "add_generation_prompt": agp}
                try:
                    case["output"] = tmpl.render(messages=conv, add_generation_prompt=agp, bos_token="<BOS>",
                                                 eos_token="<EOS>")
                except Exception as e:  # noqa: BLE001
                    case["error"] = f"{type(e).__name__}: {e}"
                cases.append(case)
        if all("error" in c for c in cases):
            print(f"dropped {name}: every case fails in jinja2: {cases[0]['error']}")
            continue
        shutil.copyfile(os.path.join(args.templates, fn), os.path.join(args.out, fn))
        result["templates"][name] = {"sha256": hashlib.sha256(src.encode()).hexdigest(), "cases": cases}
        n_ok = sum("output" in c for c in cases)
        print(f"{name}: {n_ok}/{len(cases)} rendered")
    with open(os.path.join(args.out, "renderings.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, ensure_ascii=False, indent=1)
    print(f"{len(result['templates'])} templates -> {args.out}/renderings.json")


if __name__ == "__main__":
    main()
