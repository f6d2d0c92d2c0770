#!/usr/bin/env python3
"""ultra serve on the GPU under concurrent streams: a Llama-3-8B-shaped model (random BF16 weights), one stream
vs 8 vs 32, and the server goals of the issue.

For the GPU machine (an H200; the build must have CUDA: `cmake -S . -B build -G Ninja && cmake --build build
--target bench_server`):

  1. the model: an HF safetensors directory made with transformers by bench/cuda_compare.py's make_model()
     (its SHAPES["8b"]: Llama-3.1-8B's shape, random weights) in --model-dir, once (reused when config.json is
     there); plus a tokenizer.json that the server needs (it decodes what it streams): a byte-level BPE of
     exactly the model's vocabulary (the 256 byte tokens, filler tokens t256, t257, ..., and the last 256 ids
     special: <|begin_of_text|>, <|end_of_text|>, <|reserved_special_token_K|>), written here without
     network access;
  2. `bench_server -m DIR --device cuda -c CTX --streams 1,8,32 -n N --requests R --prompt-ids P --json`: the
     server in process with one KV slot per stream of the largest count, each stream sending R streaming
     /v1/completions requests of P prompt token ids and N sampled tokens (ignore_eos) one after another,
     after a warm-up round (bench/bench_server.cpp);
  3. a table of aggregate tok/s, TTFT and ITL p50 / p99 per stream count, and the two goals:
       aggregate tok/s at 32 streams >= 10x one stream's;
       ITL p99 at 32 streams < 2x the single-stream step time (one stream's ITL p50: one decode step).

    python3 bench/server_gpu.py [--bench build/bench_server] [--model-dir /tmp/ultra-gpu/llama3-8b-hf]
                                [--streams 1,8,32] [-n 128] [--requests 2] [--prompt-ids 128] [--ctx 1024]
                                [--device cuda] [--strict] [--json OUT.json]

--strict exits 1 when a goal is missed. --device cpu runs the same on the CPU (a smoke test of this script
on any HF Llama directory given as --model-dir, e.g. a copy of tests/fixtures/hf/llama_gqa: no transformers
needed when config.json is there).
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def byte_to_unicode():
    """GPT-2's byte -> printable character map (the alphabet of byte-level BPE tokens)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def write_tokenizer(model_dir, vocab_size):
    """A byte-level BPE tokenizer.json (+ tokenizer_config.json) with exactly vocab_size tokens."""
    if vocab_size < 258:
        sys.exit(f"vocab_size {vocab_size}: too small for a byte-level tokenizer")
    n_special = min(256, vocab_size - 256)
    first_special = vocab_size - n_special
    vocab = {ch: b for b, ch in byte_to_unicode().items()}
    for i in range(256, first_special):
        vocab[f"t{i}"] = i
    names = ["<|begin_of_text|>", "<|end_of_text|>"]
    added = []
    for k in range(n_special):
        content = names[k] if k < len(names) else f"<|reserved_special_token_{k - len(names)}|>"
        added.append(dict(id=first_special + k, content=content, single_word=False, lstrip=False, rstrip=False,
                          normalized=False, special=True))
    tok = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "vocab": vocab,
                  "merges": []},
    }
    with open(os.path.join(model_dir, "tokenizer.json"), "w") as f:
        json.dump(tok, f, ensure_ascii=False)
    with open(os.path.join(model_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": names[0], "eos_token": names[1], "add_bos_token": True}, f)


def make_model_dir(model_dir, shape):
    """The random-weight HF model (bench/cuda_compare.py's make_model) when model_dir has none, then the
    tokenizer when it has none."""
    os.makedirs(model_dir, exist_ok=True)
    if not os.path.exists(os.path.join(model_dir, "config.json")):
        print(f"making the {shape} model in {model_dir} (transformers, random weights) ...", flush=True)
        try:
            import torch
            from cuda_compare import make_model
        except ImportError as e:
            sys.exit(f"making the model needs torch and transformers ({e}); or give a --model-dir holding one")
        _, model = make_model(shape, model_dir)
        del model
        torch.cuda.empty_cache()
    if not os.path.exists(os.path.join(model_dir, "tokenizer.json")):
        with open(os.path.join(model_dir, "config.json")) as f:
            vocab_size = json.load(f)["vocab_size"]
        write_tokenizer(model_dir, vocab_size)
        print(f"wrote a byte-level tokenizer of {vocab_size} tokens to {model_dir}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench", default=os.path.join(ROOT, "build", "bench_server"), help="the bench_server binary")
    ap.add_argument("--model-dir", default="/tmp/ultra-gpu/llama3-8b-hf")
    ap.add_argument("--shape", default="8b", help="bench/cuda_compare.py SHAPES key, for a new --model-dir")
    ap.add_argument("--streams", default="1,8,32")
    ap.add_argument("-n", type=int, default=128, help="tokens per request")
    ap.add_argument("--requests", type=int, default=2, help="requests per stream, one after another")
    ap.add_argument("--prompt-ids", type=int, default=128, help="prompt length in token ids")
    ap.add_argument("--ctx", type=int, default=1024, help="context per slot")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a goal is missed")
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args()
    try:
        streams = [int(s) for s in args.streams.split(",")]
        if not streams or min(streams) < 1:
            raise ValueError
    except ValueError:
        ap.error(f"--streams {args.streams!r}: expected positive integers separated by commas")
    if args.prompt_ids + args.n > args.ctx:
        ap.error(f"--prompt-ids + -n ({args.prompt_ids + args.n}) exceeds --ctx {args.ctx}")
    if not os.path.exists(args.bench):
        sys.exit(f"{args.bench} not found: cmake --build build --target bench_server (a CUDA build for --device cuda)")

    make_model_dir(args.model_dir, args.shape)
    cmd = [args.bench, "-m", args.model_dir, "--device", args.device, "-c", str(args.ctx), "--streams", args.streams,
           "-n", str(args.n), "--requests", str(args.requests), "--prompt-ids", str(args.prompt_ids), "--json"]
    print("$ " + " ".join(cmd), flush=True)
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    sys.stderr.write(r.stderr)
    if r.returncode != 0:
        sys.exit(f"bench_server failed ({r.returncode}):\n{r.stdout[-2000:]}")
    lines = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    head, rows = lines[0], {row["streams"]: row for row in lines[1:]}

    print(f"\n{head['server']}; {head['prompts']}, {head['tokens_per_request']} tokens per request, "
          f"{head['requests_per_stream']} request(s) per stream\n")
    print("| streams | aggregate tok/s | per-stream tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for s in streams:
        x = rows[s]
        print(f"| {s} | {x['aggregate_tps']:.1f} | {x['per_stream_tps']:.1f} | {x['ttft_p50_ms']:.1f} | "
              f"{x['ttft_p99_ms']:.1f} | {x['itl_p50_ms']:.2f} | {x['itl_p99_ms']:.2f} |")

    goals = []
    if 1 in rows and 32 in rows:
        one, many = rows[1], rows[32]
        speedup = many["aggregate_tps"] / one["aggregate_tps"]
        step = one["itl_p50_ms"]  # one stream: one decode step per token
        goals = [
            dict(goal="aggregate tok/s at 32 streams >= 10x one stream", value=f"{speedup:.1f}x", ok=speedup >= 10),
            dict(goal="ITL p99 at 32 streams < 2x the single-stream step time",
                 value=f"{many['itl_p99_ms']:.2f} ms vs 2 x {step:.2f} ms", ok=many["itl_p99_ms"] < 2 * step),
        ]
        print()
        for g in goals:
            print(f"{'met   ' if g['ok'] else 'MISSED'}  {g['goal']}: {g['value']}")
    else:
        print("\nthe goals need stream counts 1 and 32")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(header=head, rows=list(rows.values()), goals=goals), f, indent=1)
    if args.strict and not all(g["ok"] for g in goals):
        sys.exit(1)


if __name__ == "__main__":
    main()
