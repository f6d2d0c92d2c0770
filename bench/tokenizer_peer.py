#!/usr/bin/env python3
"""Tokenizer encode throughput, ultra vs HF `tokenizers`, one thread, same text and vocabulary.

The vocabulary is llama.cpp's gpt-2 vocab GGUF (tests/fixtures/vocab/ggml-vocab-gpt-2.gguf): its tokens and
merges are read here (a minimal GGUF reader) and handed to tokenizers' BPE model with the GPT-2 byte-level
pre-tokenizer, so both engines run the same vocabulary. Runs on a machine with `tokenizers` (the GPU
machine); ultra's side is bench/bench_tokenizer (thread CPU time) and `ultra tokenize --ids` (for the
identity check of the ids).

    python3 bench/tokenizer_peer.py --bench build/bench_tokenizer --ultra build/ultra \
        --vocab tests/fixtures/vocab/ggml-vocab-gpt-2.gguf --text tinyshakespeare.txt
"""
import argparse
import os
import re
import struct
import subprocess
import time

os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ["RAYON_NUM_THREADS"] = "1"


def read_gguf_kv(path):
    """Metadata of a GGUF v2/v3 file (enough for strings, ints, floats, bools and arrays of them)."""
    f = open(path, "rb")
    assert f.read(4) == b"GGUF"
    version, n_tensors, n_kv = struct.unpack("<IQQ", f.read(20))

    def rstr():
        (n,) = struct.unpack("<Q", f.read(8))
        return f.read(n).decode("utf-8", errors="surrogateescape")

    scalar = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}

    def rval(t):
        if t == 8:
            return rstr()
        if t == 9:
            et, n = struct.unpack("<IQ", f.read(12))
            return [rval(et) for _ in range(n)]
        fmt = scalar[t]
        return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]

    kv = {}
    for _ in range(n_kv):
        k = rstr()
        (t,) = struct.unpack("<I", f.read(4))
        kv[k] = rval(t)
    return kv


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True)
    ap.add_argument("--ultra", required=True)
    ap.add_argument("--vocab", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()

    import tokenizers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    kv = read_gguf_kv(a.vocab)
    tokens = kv["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ", 1)) for m in kv["tokenizer.ggml.merges"]]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    text = open(a.text, encoding="utf-8").read()
    mb = len(text.encode("utf-8")) / 1e6

    t0 = time.thread_time()
    ids_hf = tok.encode(text).ids
    cold = time.thread_time() - t0
    warm = min(((lambda s: (tok.encode(text), time.thread_time() - s)[1])(time.thread_time())) for _ in range(a.reps))
    print(f"HF tokenizers {tokenizers.__version__}: cold {mb / cold:.1f} MB/s, warm {mb / warm:.1f} MB/s "
          f"({len(ids_hf)} tokens, one thread, thread CPU time)")

    # Also HF on the same text split into lines (keeping the newlines), batched on one thread: the way a
    # corpus is usually fed to it.
    lines = text.splitlines(keepends=True)
    batch = min(((lambda s: (tok.encode_batch(lines), time.thread_time() - s)[1])(time.thread_time()))
                for _ in range(a.reps))
    print(f"HF tokenizers, encode_batch of {len(lines)} lines on one thread: {mb / batch:.1f} MB/s (best of {a.reps})")

    out = subprocess.run([a.bench, a.vocab, a.text, str(a.reps)], capture_output=True, text=True)
    print("ultra bench_tokenizer:\n" + out.stdout + out.stderr)
    ours = subprocess.run([a.ultra, "tokenize", "-m", a.vocab, "--ids", "-f", a.text], capture_output=True, text=True)
    ids_ultra = [int(x) for x in ours.stdout.split()]
    same = ids_ultra == ids_hf
    print(f"ids identical to HF on the whole text: {same} ({len(ids_ultra)} vs {len(ids_hf)} tokens)")
    c = re.search(r"encode cold[^:]*:\s+([0-9.]+) MB/s", out.stdout)
    w = re.search(r"encode warm[^:]*:\s+([0-9.]+) MB/s", out.stdout)
    if c and w:
        print(f"ratio ultra/HF: cold {float(c.group(1)) / (mb / cold):.2f}x, warm {float(w.group(1)) / (mb / warm):.2f}x")


if __name__ == "__main__":
    main()
