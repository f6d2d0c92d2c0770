#!/usr/bin/env python3
"""Speculative decoding benchmark: the bundled pair (models/target.gguf + models/draft.gguf), plain decoding
against speculative decoding with a K sweep, adaptive draft length (--draft-p-min) and prompt lookup, greedy
and sampled, through `ultra run --json` (the same binary and flags a user runs).

    python3 tools/bench_speculative.py [--ultra build/ultra] [-n 256] [--reps 3] [--device cpu|cuda] [-t N]

For every configuration and prompt it runs `ultra run` --reps times, keeps the fastest run's decode time
(the rounds after the first token: eval_ms), and prints per configuration: decode tokens/s (total tokens
over total time across the prompts), the speedup over plain decoding with the same sampling settings,
the acceptance rate (accepted / drafted), accepted drafts per round and tokens per target pass.
Greedy speculative output is checked against plain greedy output (it must be identical).
"""
import argparse
import json
import subprocess
import sys

PROMPTS = [
    "ROMEO:",
    "KING RICHARD III:\nNow is the winter of our discontent",
    "First Citizen:\nBefore we proceed any further, hear me speak.",
    "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?",
    "MENENIUS:\nI tell you, friends, most charitable care",
    "DUKE VINCENTIO:\nWhat is the news?",
]


def run(args, flags, prompt):
    cmd = [args.ultra, "run", "-p", prompt, "-n", str(args.n), "--json", "--ignore-eos", "--device", args.device]
    if args.threads:
        cmd += ["-t", str(args.threads)]
    cmd += flags
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{out.stderr}")
    return json.loads(out.stdout)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ultra", default="build/ultra")
    p.add_argument("-n", type=int, default=256, help="tokens generated per prompt")
    p.add_argument("--reps", type=int, default=3, help="runs per (configuration, prompt): the fastest counts")
    p.add_argument("--device", default="cpu")
    p.add_argument("-t", "--threads", type=int, default=0)
    args = p.parse_args()

    modes = [("greedy", ["--temp", "0"]), ("sampled", ["--temp", "0.8", "--top-k", "40", "--top-p", "0.95",
                                                        "-s", "7"])]
    configs = [("plain", [])]
    configs += [(f"draft K={k}", ["--speculative", "--draft-max", str(k)]) for k in (1, 2, 3, 4, 6, 8)]
    configs += [(f"draft K=8 p-min {pm}", ["--speculative", "--draft-max", "8", "--draft-p-min", str(pm)])
                for pm in (0.3, 0.5, 0.7, 0.9)]
    configs += [("lookup 2, K=4", ["--lookup", "2", "--draft-max", "4"]),
                ("draft K=4 + lookup 2", ["--speculative", "--draft-max", "4", "--lookup", "2"])]

    print(f"# ultra: {args.ultra}, device {args.device}, {len(PROMPTS)} prompts x {args.n} tokens, best of "
          f"{args.reps}")
    print("| sampling | configuration | decode tok/s | speedup | acceptance | accepted/round | tokens/target pass |")
    print("|---|---|---|---|---|---|---|")
    for mode, mflags in modes:
        base_tps = None
        plain_ids = {}
        for name, cflags in configs:
            tokens = ms = drafted = accepted = rounds = passes = 0
            for prompt in PROMPTS:
                best = None
                for _ in range(args.reps):
                    j = run(args, mflags + cflags, prompt)
                    if best is None or j["timings"]["eval_ms"] < best["timings"]["eval_ms"]:
                        best = j
                ids = best["generated_ids"]
                if name == "plain":
                    plain_ids[prompt] = ids
                elif mode == "greedy" and ids != plain_ids[prompt]:
                    sys.exit(f"greedy speculative output differs from plain greedy: {name}, prompt {prompt!r}")
                tokens += len(ids) - 1
                ms += best["timings"]["eval_ms"]
                passes += best["timings"]["eval_tokens"]
                s = best.get("speculative")
                if s:
                    drafted += s["drafted"]
                    accepted += s["accepted"]
                    rounds += s["rounds"]
            tps = 1e3 * tokens / ms
            if name == "plain":
                base_tps = tps
            acc = f"{100.0 * accepted / drafted:.1f}%" if drafted else "-"
            per_round = f"{accepted / rounds:.2f}" if rounds else "-"
            print(f"| {mode} | {name} | {tps:.1f} | {tps / base_tps:.2f}x | {acc} | {per_round} | "
                  f"{tokens / passes:.2f} |", flush=True)


if __name__ == "__main__":
    main()
