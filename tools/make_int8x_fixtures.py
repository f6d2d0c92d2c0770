#!/usr/bin/env python3
"""Reference logits for Q8_0 with int8 activations (the CPU path on AVX512-VNNI CPUs, and llama.cpp's numerics
for Q8_0), added to the existing HF fixtures of tools/make_fixtures.py without touching their models.

Run on a machine with torch + transformers (the GPU machine; its CPU, float32):
    python3 tools/make_int8x_fixtures.py [-d tests/fixtures/hf]

For each fixture directory with a logits_q8_0w.bin it loads the checkpoint, rounds every 2-D weight matrix to
Q8_0 exactly as make_fixtures.py does, and quantises the input of every nn.Linear per 32-column block to int8:
d = max|x| / 127, q = round-half-even(x * (127 / max|x|)) in float32 (the engine's quantize_x_q8_ref; each
product then is d_w * d_x * the exact integer dot product). Norms, embeddings, attention and the activation
functions stay float32, as in the engine. It writes
  logits_q8_0w_int8x.bin       [n_prompt, n_vocab] float32 logits of the prompt
and adds to reference.json "greedy_q8_0w_int8x" (32 greedy ids) and "greedy_q8_0w_int8x_margins" (each
step's top-2 logit gap, so that a test can tell a near tie from a wrong token).
"""
import argparse
import json
import os
import sys

import torch
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402  (round_q8_0, rounded_copy, prompt_logits, greedy, save_logits)


def quantize_x(x):
    """x [..., cols] float32 -> the dequantised int8 blocks (q * d), as the engine's quantize_x_q8_ref."""
    shape = x.shape
    b = x.reshape(*shape[:-1], shape[-1] // 32, 32).to(torch.float32)
    m = b.abs().amax(dim=-1, keepdim=True)
    inv = torch.where(m > 0, torch.tensor(127.0, dtype=torch.float32) / m, torch.zeros_like(m))
    q = torch.round(b * inv)  # half to even, as vcvtps2dq and nearbyint in the default rounding mode
    return (q * (m / torch.tensor(127.0, dtype=torch.float32))).reshape(shape)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-d", "--dir", default="tests/fixtures/hf")
    args = ap.parse_args()
    for name in sorted(os.listdir(args.dir)):
        d = os.path.join(args.dir, name)
        if not os.path.exists(os.path.join(d, "logits_q8_0w.bin")):
            continue
        ref_path = os.path.join(d, "reference.json")
        ref = json.load(open(ref_path))
        model = AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager", dtype=torch.float32).eval()
        rm = mf.rounded_copy(model, mf.round_q8_0)
        q8 = mf.prompt_logits(rm, ref["prompt"])
        for mod in rm.modules():
            if isinstance(mod, torch.nn.Linear):
                assert mod.in_features % 32 == 0, (name, mod)
                mod.register_forward_pre_hook(lambda _m, a: (quantize_x(a[0]),) + tuple(a[1:]))
        logits = mf.prompt_logits(rm, ref["prompt"])
        gen, margins = mf.greedy(rm, ref["prompt"], len(ref["greedy"]))
        mf.save_logits(os.path.join(d, "logits_q8_0w_int8x.bin"), logits)
        ref["greedy_q8_0w_int8x"] = gen
        ref["greedy_q8_0w_int8x_margins"] = [round(m, 6) for m in margins]
        json.dump(ref, open(ref_path, "w"), indent=1)
        print(f"{name:18s} int8 x vs f32 x (Q8_0 weights): logits max-abs {float((logits - q8).abs().max()):.4g}, "
              f"greedy equal for {next((i for i, (a, b) in enumerate(zip(gen, ref['greedy_q8_0w'])) if a != b), len(gen))}"
              f" of {len(gen)}; smallest margin {min(margins):.4g}")


if __name__ == "__main__":
    main()
