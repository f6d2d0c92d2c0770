#!/usr/bin/env python3
"""ultra's CUDA backend vs PyTorch (HF transformers) on the GPU, side by side, same weights.

For each model shape it makes a random-weight Llama in BF16 with transformers on the GPU, saves it as an
HF safetensors directory, then measures
  * ultra:   `ultra bench --device cuda -m DIR -p P -n G --json` (prefill of P tokens; G single-token decode
             steps with greedy sampling inside the step, replayed as CUDA graphs)
  * PyTorch: model.generate() with a static KV cache, which transformers compiles with torch.compile
             (CUDA graphs), greedy; decode tokens/s = (G - 1) / (t(G) - t(1)); prefill tokens/s from a
             forward over P tokens.
and prints tokens/s, the ratio ultra / PyTorch, the host launch time per token, and the share of the
HBM read roofline each decode reaches: bytes one token must read (every weight matrix once, the LM head,
one embedding row, the KV cache at mid-decode) / time per token, over a read bandwidth measured here.

    python3 bench/cuda_compare.py --ultra .devbin/ultra [--shapes 1b,8b] [--prompt 512] [--gen 128]
Needs: torch + transformers (the GPU machine has them), a built ultra with CUDA.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import torch

SHAPES = {  # Llama 3.2 1B and Llama 3.1 8B
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True, head_dim=64),
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False, head_dim=128),
}


def read_bandwidth():
    x = torch.empty(4 << 30, dtype=torch.uint8, device="cuda").view(torch.float32)
    x.uniform_()
    for _ in range(3):
        x.sum()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(10):
        s.record()
        x.sum()
        e.record()
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e) / 1e3)
    del x
    return (4 << 30) / sorted(ts)[len(ts) // 2]


def make_model(shape, path):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(**SHAPES[shape], max_position_embeddings=4096, rope_theta=500000.0, rms_norm_eps=1e-5,
                      torch_dtype="bfloat16")
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.eval()
    if not os.path.exists(os.path.join(path, "config.json")):
        model.save_pretrained(path, safe_serialization=True, max_shard_size="100GB")
    return cfg, model


def bytes_per_token(cfg, ctx):
    d, f, L, V = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size
    hd = cfg.head_dim
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    layer = d * (q + 2 * kv) + q * d + 3 * d * f
    weights = 2 * (L * layer + V * d + d)  # BF16; the LM head (== embeddings when tied) read once
    kv_bytes = 2 * L * 2 * kv * ctx  # F16 K and V of `ctx` positions
    return weights + kv_bytes


def torch_peer(model, cfg, P, G):
    from transformers import GenerationConfig
    ids = torch.randint(0, cfg.vocab_size, (1, P), device="cuda")
    gc = GenerationConfig(do_sample=False, cache_implementation="static", max_new_tokens=G, min_new_tokens=G,
                          pad_token_id=0, eos_token_id=None)

    def run(n):
        gc.max_new_tokens = gc.min_new_tokens = n
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            model.generate(ids, generation_config=gc)
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    for _ in range(2):  # compile and warm up
        run(G)
        run(1)
    tg = sorted(run(G) for _ in range(3))[1]
    t1 = sorted(run(1) for _ in range(3))[1]
    with torch.no_grad():
        for _ in range(2):
            model(ids)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(3):
            model(ids)
        torch.cuda.synchronize()
        pp = 3 * P / (time.perf_counter() - t0)
    return dict(tg_tps=(G - 1) / (tg - t1), pp_tps=pp, compiled=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ultra", default="build/ultra")
    ap.add_argument("--shapes", default="1b,8b")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", default="/tmp/ultra-cuda-bench")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    args = ap.parse_args()
    bw = read_bandwidth()
    print(f"read bandwidth (torch sum over 4 GiB): {bw / 1e9:.0f} GB/s", flush=True)
    rows = []
    for shape in args.shapes.split(","):
        path = os.path.join(args.dir, shape)
        os.makedirs(path, exist_ok=True)
        t0 = time.time()
        cfg, model = make_model(shape, path)
        print(f"[{shape}] model ready in {time.time() - t0:.1f} s", flush=True)
        p = torch_peer(model, cfg, args.prompt, args.gen)
        print(f"[{shape}] pytorch {json.dumps(p)}", flush=True)
        del model
        torch.cuda.empty_cache()
        r = subprocess.run([args.ultra, "bench", "--device", "cuda", "-m", path, "-p", str(args.prompt), "-n",
                            str(args.gen), "-r", str(args.reps), "--json"], capture_output=True, text=True)
        if r.returncode != 0:
            print(f"[{shape}] ultra failed: {r.stderr[-2000:]}", flush=True)
            continue
        u = json.loads(r.stdout)
        res = {x["test"]: x for x in u["results"]}
        tg_u, pp_u = res[f"tg{args.gen}"]["tps_mean"], res[f"pp{args.prompt}"]["tps_mean"]
        b = bytes_per_token(cfg, args.gen // 2)
        row = dict(shape=shape, tg_ultra=tg_u, tg_torch=p["tg_tps"], tg_ratio=tg_u / p["tg_tps"], pp_ultra=pp_u,
                   pp_torch=p["pp_tps"], pp_ratio=pp_u / p["pp_tps"], roofline_ultra=tg_u * b / bw,
                   roofline_torch=p["tg_tps"] * b / bw, launch_us=u.get("launch_us_mean", 0), mb_per_token=b / 1e6)
        rows.append(row)
        print(json.dumps(row), flush=True)
    with open(os.path.join(args.out, "cuda_compare.json"), "w") as f:
        json.dump(dict(read_bw=bw, rows=rows), f, indent=1)
    print(f"\n| shape | MB/token | tg{args.gen} ultra | tg{args.gen} PyTorch | ratio | ultra % roofline |"
          f" PyTorch % roofline | host launch us | pp{args.prompt} ultra | pp{args.prompt} PyTorch | ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['shape']} | {r['mb_per_token']:.0f} | {r['tg_ultra']:.1f} | {r['tg_torch']:.1f} |"
              f" {r['tg_ratio']:.2f}x | {100 * r['roofline_ultra']:.0f}% | {100 * r['roofline_torch']:.0f}% |"
              f" {r['launch_us']:.2f} | {r['pp_ultra']:.0f} | {r['pp_torch']:.0f} | {r['pp_ratio']:.2f}x |")


if __name__ == "__main__":
    sys.exit(main())
