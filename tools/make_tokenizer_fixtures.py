#!/usr/bin/env python3
"""Make the HF tokenizers reference fixtures for tests/test_tokenizer.cpp (HfFixture tests).

Runs where the Python `tokenizers` package is installed (no network needed):

    python3 tools/make_tokenizer_fixtures.py [OUT_DIR]     # default: tests/fixtures/hf_tokenizer

It trains three small BPE tokenizers with `tokenizers` on a corpus built here (code, whitespace runs, CJK,
emoji, accented text), saves each as a tokenizer.json, and records HF's encodings of a set of test texts:

  bytelevel.json   GPT-2 style: ByteLevel pre-tokenizer (GPT-2 regex) + ByteLevel decoder, special and
                   non-special added tokens.
  split.json       llama-3 style: Sequence[Split(llama-3 regex, Isolated), ByteLevel(use_regex=False)],
                   ignore_merges when this tokenizers version has it.
  metaspace.json   SentencePiece style: Metaspace pre-tokenizer, byte_fallback with <0xNN> tokens, unk,
                   TemplateProcessing "<s> $A" (so add_special_tokens adds BOS).

encodings.json: {"tokenizers_version": ..., "cases": [{"tokenizer", "text", "ids", "ids_special",
"decoded"}]} where ids = encode(text, add_special_tokens=False).ids, ids_special the same with True, and
decoded = decode(ids, skip_special_tokens=False).

Deterministic: fixed corpus, single-threaded training (RAYON_NUM_THREADS=1), sorted JSON keys. Output is
about 150 KB in all (the script prints the total).
"""

import json
import os
import sys

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import tokenizers  # noqa: E402
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: E402

LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def corpus():
    """A fixed training corpus mixing prose, code, whitespace runs, CJK, emoji and accented text."""
    prose = [
        "The quick brown fox jumps over the lazy dog.",
        "It's a truth universally acknowledged, isn't it? We'll see; they'd agree, I'm sure.",
        "Numbers: 0 1 12 123 1234 12345 3.14159 2,718 1e-9 0xFF 1_000_000",
        "Café, naïve, façade, résumé, Ångström, Øresund, Straße, İstanbul, coöperate, jalapeño.",
        "Ελληνικά κείμενα και Кириллица: Привет, как дела? Здравствуйте!",
        "日本語のテキストと中文文本，还有한국어 문장도 있습니다。",
        "Emoji: 😀 😃 🚀 👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️ ✅ 🦀🐍",
        "Tabs\tand\tnewlines\nand  double  spaces   and    more     spaces.",
        "Mixed: naïve café 東京 🚀 ok; ÀÉÎÕÜ àéîõü ñ ç ß ø å æ œ.",
    ]
    code = [
        "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
        "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}\n",
        "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }\n",
        "const x = {a: 1, 'b': [2, 3], \"c\": null}; // comment\n",
        "    if x == y and not z:\n        pass  # indented\n\n\n",
        "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;\n",
        "<html><body><p class=\"x\">Hello &amp; welcome</p></body></html>\n",
    ]
    lines = []
    for rep in range(40):
        for i, s in enumerate(prose + code):
            # Deterministic variation: rotate words, vary whitespace runs.
            words = s.split(" ")
            k = (rep * 7 + i) % max(1, len(words))
            lines.append(" ".join(words[k:] + words[:k]))
            lines.append(s + " " * (rep % 5) + "\n" * (rep % 3))
    return lines


TEXTS = [
    "",
    " ",
    "  ",
    "\t",
    "\n",
    "\n\n\n",
    "Hello world",
    " Hello world",
    "Hello, y'all! How're you 😁 ?",
    "It's ALL CAPS: I'LL, WE'VE, THEY'RE, 'S",
    "def f(x):\n    return x * 2\n\n\n",
    "for (int i = 0; i < 10; ++i) {\n\t\tfoo(i);\n}",
    "   leading and trailing spaces   ",
    "a  b   c    d     e\t\tf\n\ng",
    "Café naïve façade Ångström Straße",
    "e\u0301 (combining acute) vs é",
    "日本語のテキスト、中文文本，한국어 문장。",
    "🚀👍🏽👨‍👩‍👧‍👦🇫🇷❤️",
    "12345678901234567890 3.14 1,000",
    "Привет, мир! Ελληνικά",
    "\u00a0non-breaking\u00a0spaces\u2003em space\u3000ideographic",
    "zero\u200bwidth\u200djoiner\ufeffbom",
    "\ufffd replacement \ufffd\ufffd",
    "\u0000 NUL \u0001 \u007f DEL \u0085 NEL",
    "\u00c3\u00a9 looks like mojibake \u00e2\u0080\u0099",
    "\ud7ff\ue000\uffff\U0001f600\U0010ffff",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more text",
    "<tool>call</tool> <tool>",
    "\u00ff\u00fe raw-looking latin1 \u00c0\u00c1",
]


def train(pre_tokenizer, model, decoder, normalizer=None, extra_special=(), vocab_size=700):
    tok = Tokenizer(model)
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoder
    kw = {}
    if isinstance(pre_tokenizer, pre_tokenizers.ByteLevel) or isinstance(pre_tokenizer, pre_tokenizers.Sequence):
        kw["initial_alphabet"] = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=list(extra_special) + SPECIAL,
        **kw,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    tok.add_tokens([AddedToken("<tool>", special=False, normalized=False)])
    return tok


def make(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    toks = {}

    toks["bytelevel.json"] = train(
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        models.BPE(),
        decoders.ByteLevel(),
    )

    try:
        split_model = models.BPE(ignore_merges=True)
    except TypeError:  # older tokenizers
        split_model = models.BPE()
    toks["split.json"] = train(
        pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(tokenizers.Regex(LLAMA3_REGEX), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        ),
        split_model,
        decoders.ByteLevel(),
    )

    byte_tokens = [f"<0x{i:02X}>" for i in range(256)]
    try:
        meta_pre = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
        meta_dec = decoders.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    except TypeError:
        meta_pre = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
        meta_dec = decoders.Metaspace(replacement="\u2581", prepend_scheme="first")
    meta = train(
        meta_pre,
        models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True),
        decoders.Sequence([decoders.ByteFallback(), meta_dec]),
        extra_special=["<unk>", "<s>", "</s>"] + byte_tokens,
        vocab_size=900,
    )
    bos = meta.token_to_id("<s>")
    meta.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    toks["metaspace.json"] = meta

    cases = []
    for name, tok in toks.items():
        tok.save(os.path.join(out_dir, name), pretty=False)
        for text in TEXTS:
            ids = tok.encode(text, add_special_tokens=False).ids
            ids_special = tok.encode(text, add_special_tokens=True).ids
            cases.append(
                {
                    "tokenizer": name,
                    "text": text,
                    "ids": ids,
                    "ids_special": ids_special,
                    "decoded": tok.decode(ids, skip_special_tokens=False),
                }
            )
    with open(os.path.join(out_dir, "encodings.json"), "w", encoding="utf-8") as f:
        # One case per line (ASCII-escaped), so that a regenerated file diffs readably.
        f.write('{"tokenizers_version": %s, "cases": [\n' % json.dumps(tokenizers.__version__))
        f.write(",\n".join(json.dumps(c, sort_keys=True, ensure_ascii=True) for c in cases))
        f.write("\n]}\n")
    total = sum(os.path.getsize(os.path.join(out_dir, n)) for n in os.listdir(out_dir))
    print(f"wrote {len(cases)} cases for {len(toks)} tokenizers to {out_dir} ({total / 1024:.0f} KB)")


if __name__ == "__main__":
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    make(sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "tests", "fixtures", "hf_tokenizer"))
