#!/usr/bin/env python3
"""Speculative decoding costs on the GPU with a Llama-3-8B-shaped target and a Llama-3.2-1B-shaped draft
(random BF16 weights, the shapes of bench/cuda_compare.py), through `ultra run --json --device cuda`.

Random weights make the two models disagree (acceptance ~0), so the speedup cannot be measured with them
directly. What is measured instead, for each K: the cost of one draft step (draft_ms / drafted tokens) and of
one verification pass of K + 1 rows (verify_ms / target passes), and plain decoding's time per token; the
speedup they imply at acceptance rate a is E(a, K) * t_plain / (t_verify(K) + K t_draft) with
E(a, K) = (1 - a^(K+1)) / (1 - a) tokens per round (Leviathan et al. 2023). The target drafting for itself
(-md the same model, greedy: every draft kept) is the 100%-acceptance bound, measured end to end.

    python3 bench/speculative_gpu.py --ultra .devbin/ultra [--gen 128] [--out DIR]
"""
import argparse
import json
import os
import random
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cuda_compare import make_model  # noqa: E402


def run(args, model, extra, prompt):
    cmd = [args.ultra, "run", "-m", model, "--prompt-ids", ",".join(map(str, prompt)), "-n", str(args.gen),
           "--temp", "0", "--ignore-eos", "--json", "--device", "cuda", "-c", "1024"] + extra
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd[:4])} ... {' '.join(extra)}\n{out.stderr[-2000:]}")
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ultra", default=".devbin/ultra")
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--dir", default="/tmp/ultra-spec-models")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    args = ap.parse_args()

    import torch
    paths = {}
    for shape in ("8b", "1b"):
        paths[shape] = os.path.join(args.dir, shape)
        if not os.path.exists(os.path.join(paths[shape], "config.json")):
            _, m = make_model(shape, paths[shape])
            del m
            torch.cuda.empty_cache()
    random.seed(0)
    prompt = [random.randrange(1, 128000) for _ in range(64)]

    plain = run(args, paths["8b"], [], prompt)
    t_plain = plain["timings"]["eval_ms"] / plain["timings"]["eval_tokens"]
    print(f"plain 8B decode: {t_plain:.3f} ms per token ({1e3 / t_plain:.1f} tok/s)", flush=True)
    rows = []
    for K in (1, 2, 4, 8):
        j = run(args, paths["8b"], ["-md", paths["1b"], "--draft-max", str(K)], prompt)
        s = j["speculative"]
        passes = j["timings"]["eval_tokens"]
        t_draft = s["draft_ms"] / max(1, s["drafted"])
        t_verify = s["verify_ms"] / max(1, passes)
        same = run(args, paths["8b"], ["-md", paths["8b"], "--draft-max", str(K)], prompt)
        n_same = len(same["generated_ids"]) - 1
        bound = (n_same / same["timings"]["eval_ms"]) * t_plain
        ss = same["speculative"]
        if j["generated_ids"] != plain["generated_ids"] or same["generated_ids"] != plain["generated_ids"]:
            sys.exit(f"K={K}: greedy speculative output differs from plain greedy")
        rows.append(dict(K=K, t_draft=t_draft, t_verify=t_verify, acc=s["accepted"] / max(1, s["drafted"]),
                         bound=bound, bound_acc=ss["accepted"] / max(1, ss["drafted"])))
        print(f"K={K}: draft step {t_draft:.3f} ms, verify pass {t_verify:.3f} ms "
              f"({t_verify / t_plain:.2f}x a plain step), 1B draft acceptance {100 * rows[-1]['acc']:.1f}%; "
              f"8B drafting for itself: {bound:.2f}x plain", flush=True)

    alphas = (0.5, 0.6, 0.7, 0.8, 0.9)
    lines = ["| K | draft step (ms) | verify pass (ms) | verify / plain step | " +
             " | ".join(f"implied speedup at a={a}" for a in alphas) + " | measured, 8B drafting for itself |",
             "|---|---|---|---|" + "---|" * len(alphas) + "---|"]
    for r in rows:
        K = r["K"]
        cost = r["t_verify"] + K * r["t_draft"]
        sp = [((1 - a ** (K + 1)) / (1 - a)) * t_plain / cost for a in alphas]
        lines.append(f"| {K} | {r['t_draft']:.3f} | {r['t_verify']:.3f} | {r['t_verify'] / t_plain:.2f} | " +
                     " | ".join(f"{x:.2f}x" for x in sp) +
                     f" | {r['bound']:.2f}x ({100 * r['bound_acc']:.0f}% kept) |")
    table = f"plain 8B decode: {t_plain:.3f} ms per token\n\n" + "\n".join(lines)
    print(table)
    with open(os.path.join(args.out, "speculative_gpu.md"), "w") as f:
        f.write(table + "\n")


if __name__ == "__main__":
    main()
