#!/usr/bin/env python3
"""ultra's CUDA backend vs PyTorch on the GPU, side by side in one run, same weights.

For each model shape (random weights, made on the GPU with transformers and saved as an HF safetensors
directory that ultra loads):
  * ultra:    `ultra bench --device cuda -p 512 -n G -d 128,4096 --parallel 1,8,32 --json`: prefill pp512;
              decode at context depth 128 and 4096, one sequence and 8 / 32 sequences together (aggregate
              tokens/s); every decode step samples greedily inside the step, replayed as a CUDA graph.
  * PyTorch:  HF transformers, greedy generate(): eager with the dynamic cache, and with the static cache,
              which transformers compiles with torch.compile (CUDA graphs, "reduce-overhead"), as gpt-fast
              does. decode tokens/s = (G - 1) / (t(G) - t(1)) after a prompt of 128 tokens; prefill from a
              forward over 512 tokens.
Ceilings measured in the same run: the HBM read bandwidth (torch sum over 4 GiB) and the BF16 GEMM rate
(torch.matmul 8192^3). Decode is reported against the read roofline: bytes one token must read (every
weight matrix once, the LM head, the KV cache at its depth) / time per token.

    python3 bench/cuda_compare.py --ultra .devbin/ultra [--shapes 8b,1b,7b] [--gen 128] [--types bf16,q8_0,fp8,ternary]
--types: the weight types to run ultra on, same shape (default bf16). bf16 is the HF directory above (and the
PyTorch runs); q8_0, fp8 (F8_E4M3, a scale per row) and ternary (a scale per tensor) are GGUF files written by
tools/make_bench_gguf.py (random codes copied from a pool, seconds for 8B; cached in --dir), ultra only. Every
matrix is of the type, the LM head included. Decode is reported against both the read bandwidth and the copy
bandwidth (torch copy_ of 2 GiB: bytes read + written per second), with the bytes per token of the type.
Shapes: 8b, 7b, 1b (Llama), qwen3-8b, gemma3-4b, and the ~110M qwen3-110m / gemma3-110m of the CPU benchmark.
(Bytes per token count every weight once and the KV cache at the depth on every layer: for Gemma-3 at
depths past its window that overstates what the local layers read.)
Results go to OUT/cuda_compare.json (after each shape) and a table at the end.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import torch

SHAPES = {
    # Llama-3.1-8B, Llama-2-7B (F16, MHA, vocab 32000), Llama-3.2-1B (tied embeddings)
    "8b": dict(cfg=dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                        num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False, head_dim=128,
                        rope_theta=500000.0), dtype=torch.bfloat16),
    "7b": dict(cfg=dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                        num_key_value_heads=32, vocab_size=32000, tie_word_embeddings=False, head_dim=128,
                        rope_theta=10000.0), dtype=torch.float16),
    "1b": dict(cfg=dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                        num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True, head_dim=64,
                        rope_theta=500000.0), dtype=torch.bfloat16),
    # Qwen3-8B (q/k norms, vocab 151936) and Gemma-3-4B (GeGLU, post-norms, head_dim 256, vocab 262144,
    # 1024-token windows on 5 of every 6 layers with their own RoPE base, tied embeddings)
    "qwen3-8b": dict(arch="qwen3", cfg=dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                                            num_attention_heads=32, num_key_value_heads=8, vocab_size=151936,
                                            tie_word_embeddings=False, head_dim=128, rope_theta=1000000.0),
                     dtype=torch.bfloat16),
    "gemma3-4b": dict(arch="gemma3", cfg=dict(hidden_size=2560, intermediate_size=10240, num_hidden_layers=34,
                                              num_attention_heads=8, num_key_value_heads=4, vocab_size=262144,
                                              tie_word_embeddings=True, head_dim=256, rope_theta=1000000.0,
                                              sliding_window=1024, query_pre_attn_scalar=256),
                      dtype=torch.bfloat16),
    # the ~110M shapes of tools/make_bench_gguf.py (the CPU benchmark against llama.cpp)
    "qwen3-110m": dict(arch="qwen3", cfg=dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                                              num_attention_heads=8, num_key_value_heads=4, vocab_size=32000,
                                              tie_word_embeddings=True, head_dim=128, rope_theta=1000000.0),
                       dtype=torch.float16),
    "gemma3-110m": dict(arch="gemma3", cfg=dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                                                num_attention_heads=8, num_key_value_heads=2, vocab_size=32000,
                                                tie_word_embeddings=True, head_dim=128, rope_theta=1000000.0,
                                                sliding_window=512, query_pre_attn_scalar=128),
                        dtype=torch.float16),
}


def make_config(shape):
    """The transformers config of a shape (Llama unless its entry names another architecture)."""
    import transformers
    spec = SHAPES[shape]
    arch = spec.get("arch", "llama")
    kw = dict(spec["cfg"], max_position_embeddings=8192)
    if arch == "llama":
        return transformers.LlamaConfig(**kw, rms_norm_eps=1e-5)
    v5 = int(transformers.__version__.split(".")[0]) >= 5
    theta = kw.pop("rope_theta")
    if arch == "qwen3":
        rope = {"rope_parameters": {"rope_type": "default", "rope_theta": theta}} if v5 else {"rope_theta": theta}
        return transformers.Qwen3Config(**kw, **rope, rms_norm_eps=1e-6, attention_bias=False)
    # gemma3: every 6th layer global (base theta), the others local (base 10000)
    layers = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(kw["num_hidden_layers"])]
    if v5:
        rope = {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": theta},
                                    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}}
    else:
        rope = {"rope_theta": theta, "rope_local_base_freq": 10000.0}
    return transformers.Gemma3TextConfig(**kw, **rope, layer_types=layers, rms_norm_eps=1e-6,
                                         hidden_activation="gelu_pytorch_tanh", pad_token_id=0)


def timed(fn, reps):
    ts = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return sorted(ts)[len(ts) // 2]


def read_bandwidth():
    x = torch.empty(1 << 30, dtype=torch.float32, device="cuda").uniform_()
    x.sum()
    t = timed(lambda: x.sum(), 10)
    del x
    return (4 << 30) / t


def copy_bandwidth():
    x = torch.empty(1 << 29, dtype=torch.float32, device="cuda").uniform_()
    y = torch.empty_like(x)
    y.copy_(x)
    t = timed(lambda: y.copy_(x), 10)
    del x, y
    return 2 * (2 << 30) / t


# Weight bytes per parameter of each --types entry (F8_E4M3's per-row and ternary's per-tensor scales are
# negligible; Q8_0: 34 bytes per 32).
TYPE_BYTES = {"bf16": 2.0, "q8_0": 34 / 32, "fp8": 1.0, "ternary": 0.25}


def make_gguf(shape, wtype, path):
    """The shape as a GGUF file of wtype (tools/make_bench_gguf.py); returns the seconds it took (0: cached)."""
    if os.path.exists(path):
        return 0.0
    spec = SHAPES[shape]
    c = spec["cfg"]
    arch = spec.get("arch", "llama")
    cmd = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools",
                                        "make_bench_gguf.py"),
           "--arch", arch, "--type", wtype, "-o", path, "--dim", str(c["hidden_size"]),
           "--layers", str(c["num_hidden_layers"]), "--heads", str(c["num_attention_heads"]),
           "--kv-heads", str(c["num_key_value_heads"]), "--head-dim", str(c["head_dim"]),
           "--ffn", str(c["intermediate_size"]), "--vocab", str(c["vocab_size"]), "--ctx", "8192",
           "--rope-theta", str(c["rope_theta"]), "--rms-eps", "1e-5" if arch == "llama" else "1e-6"]
    if c.get("tie_word_embeddings"):
        cmd.append("--tie-embeddings")
    if arch == "gemma3":
        cmd += ["--sliding-window", str(c["sliding_window"]), "--swa-pattern", "6", "--rope-theta-swa", "10000"]
    t0 = time.time()
    subprocess.run(cmd, check=True)
    return time.time() - t0


def gemm_rate():
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    a @ b
    t = timed(lambda: a @ b, 10)
    return 2 * 8192**3 / t


def make_model(shape, path):
    import transformers
    spec = SHAPES[shape]
    cfg = make_config(shape)
    cls = {"llama": transformers.LlamaForCausalLM, "qwen3": transformers.Qwen3ForCausalLM,
           "gemma3": transformers.Gemma3ForCausalLM}[spec.get("arch", "llama")]
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = cls(cfg).to(spec["dtype"])
    model.eval()
    if not os.path.exists(os.path.join(path, "config.json")):
        model.save_pretrained(path, safe_serialization=True, max_shard_size="100GB")
    return cfg, model


def matmul_params(cfg):
    d, f, L, V = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size
    q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    return L * (d * (q + 2 * kv) + q * d + 3 * d * f) + V * d


def bytes_per_token(cfg, depth, esize=2.0):
    kv = cfg.num_key_value_heads * cfg.head_dim
    return esize * matmul_params(cfg) + 2 * cfg.num_hidden_layers * 2 * kv * depth  # F16 KV cache


def torch_decode(model, cfg, G, static):
    from transformers import GenerationConfig
    ids = torch.randint(0, cfg.vocab_size, (1, 128), device="cuda")
    gc = GenerationConfig(do_sample=False, max_new_tokens=G, min_new_tokens=G, pad_token_id=0, eos_token_id=None)
    if static:
        gc.cache_implementation = "static"

    def run(n):
        gc.max_new_tokens = gc.min_new_tokens = n
        with torch.no_grad():
            model.generate(ids, generation_config=gc)

    for _ in range(2 if static else 1):  # compile / warm up
        run(G)
        run(1)
    return (G - 1) / (timed(lambda: run(G), 3) - timed(lambda: run(1), 3))


def torch_prefill(model, cfg, P):
    ids = torch.randint(0, cfg.vocab_size, (1, P), device="cuda")
    with torch.no_grad():
        model(ids)
        return P / timed(lambda: model(ids), 5)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ultra", default="build/ultra")
    ap.add_argument("--shapes", default="8b,1b,7b")
    ap.add_argument("--types", default="bf16", help="weight types: bf16,q8_0,fp8,ternary (see above)")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--depths", default="128,4096")
    ap.add_argument("--parallel", default="1,8,32")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--no-torch-compile", action="store_true")
    ap.add_argument("--no-torch", action="store_true", help="ultra only")
    ap.add_argument("--profile", action="store_true",
                    help="also run ultra's decode op by op with ULTRA_CUDA_PROFILE=1 and print where time goes")
    ap.add_argument("--dir", default="/tmp/ultra-cuda-bench")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    args = ap.parse_args()
    types = args.types.split(",")
    for t in types:
        if t not in TYPE_BYTES:
            sys.exit(f"unknown --types entry {t!r} (bf16, q8_0, fp8, ternary)")
    result = dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(), read_bw=read_bandwidth(),
                  copy_bw=copy_bandwidth(), gemm_bf16=gemm_rate(), shapes={})
    print(f"{result['gpu']}: read {result['read_bw'] / 1e12:.2f} TB/s, copy {result['copy_bw'] / 1e12:.2f} TB/s, "
          f"BF16 GEMM {result['gemm_bf16'] / 1e12:.0f} TFLOP/s", flush=True)
    for shape in args.shapes.split(","):
        for wtype in types:
            if wtype == "bf16":
                continue
            os.makedirs(args.dir, exist_ok=True)
            gguf = os.path.join(args.dir, f"{shape}-{wtype}.gguf")
            cfg = make_config(shape)
            dt = make_gguf(shape, wtype, gguf)
            key = f"{shape} {wtype}"
            r = dict(shape=shape, type=wtype, gguf_write_s=dt,
                     mb_per_token={d: bytes_per_token(cfg, int(d), TYPE_BYTES[wtype]) / 1e6
                                   for d in args.depths.split(",")})
            print(f"[{key}] {gguf} {'written in %.1f s' % dt if dt else '(cached)'}", flush=True)
            run_ultra(args, key, gguf, cfg, r)
            result["shapes"][key] = r
            with open(os.path.join(args.out, "cuda_compare.json"), "w") as f:
                json.dump(result, f, indent=1)
        if "bf16" not in types:
            continue
        path = os.path.join(args.dir, shape)
        os.makedirs(path, exist_ok=True)
        t0 = time.time()
        cfg, model = make_model(shape, path)
        r = dict(shape=shape, type="bf16",
                 mb_per_token={d: bytes_per_token(cfg, int(d)) / 1e6 for d in args.depths.split(",")})
        print(f"[{shape}] model ready in {time.time() - t0:.1f} s", flush=True)
        if not args.no_torch:
            r["torch_eager_tg"] = torch_decode(model, cfg, 32, static=False)
            r["torch_pp"] = torch_prefill(model, cfg, args.prompt)
            print(f"[{shape}] PyTorch eager tg {r['torch_eager_tg']:.1f} tok/s, pp{args.prompt} "
                  f"{r['torch_pp']:.0f}", flush=True)
        if not args.no_torch and not args.no_torch_compile:
            try:
                r["torch_compiled_tg"] = torch_decode(model, cfg, args.gen, static=True)
                print(f"[{shape}] PyTorch static cache + torch.compile tg {r['torch_compiled_tg']:.1f} tok/s",
                      flush=True)
            except Exception as e:  # report, do not hide
                r["torch_compiled_error"] = repr(e)[:500]
                print(f"[{shape}] PyTorch compiled failed: {r['torch_compiled_error']}", flush=True)
        del model
        torch.cuda.empty_cache()
        run_ultra(args, shape, path, cfg, r)
        result["shapes"][shape] = r
        with open(os.path.join(args.out, "cuda_compare.json"), "w") as f:
            json.dump(result, f, indent=1)

    G = args.gen
    bw = result["read_bw"]
    print(f"\n{result['gpu']}, {result['date']}: read bandwidth {bw / 1e12:.2f} TB/s, copy bandwidth "
          f"{result['copy_bw'] / 1e12:.2f} TB/s, BF16 GEMM {result['gemm_bf16'] / 1e12:.0f} TFLOP/s")
    print("| shape | test | ultra tok/s | % read roofline | PyTorch eager | PyTorch compiled | ultra / best PyTorch |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for key, r in result["shapes"].items():
        shape = r["shape"]
        if r["type"] != "bf16":
            continue
        u = r.get("ultra", {})
        best = max(r.get("torch_eager_tg", 0), r.get("torch_compiled_tg", 0))
        for test, tps in u.items():
            if test.startswith("pp"):
                gemm = result["gemm_bf16"]
                tpp = r.get("torch_pp", 0)
                print(f"| {shape} | {test} | {tps:.0f} | {r['pp_tflops']:.0f} TFLOP/s = "
                      f"{100 * r['pp_tflops'] * 1e12 / gemm:.0f}% of GEMM | | {tpp:.0f} (eager) |"
                      f" {tps / tpp if tpp else 0:.2f}x |")
                continue
            depth = test.split("@ d")[1].split()[0] if "@ d" in test else "0"
            par = int(test.split(" x")[1]) if " x" in test else 1
            b = bytes_per_token(SHAPES_CFG(shape), int(depth)) if par == 1 else None
            roof = f"{100 * tps * b / bw:.0f}%" if b else ""
            ref = f"{tps / best:.2f}x" if par == 1 and depth == "128" and best else ""
            eager = f"{r.get('torch_eager_tg', 0):.1f}" if par == 1 and depth == "128" else ""
            comp = f"{r.get('torch_compiled_tg', 0):.1f}" if par == 1 and depth == "128" else ""
            print(f"| {shape} | {test} | {tps:.1f} | {roof} | {eager} | {comp} | {ref} |")
        # Means over every graph step of the run (x8 / x32 and prefill included): bench/decode_ab.py gives
        # the one-row decode step's.
        print(f"| {shape} | host launch call per graph step (all steps) | {r.get('launch_us', 0):.2f} us | | | | |")
        print(f"| {shape} | host submit per decode step (all tg runs) | {r.get('submit_us', 0):.2f} us | | | | |")
        print(f"| {shape} | GPU idle between graph steps (all steps) | {r.get('idle_us', 0):.2f} us | | | | |")


    # Every type: decode (one sequence) against the bandwidths, with the bytes a token reads.
    print("\n| shape | type | test | ultra tok/s | MB / token | GB/s | % read bw | % copy bw |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for key, r in result["shapes"].items():
        cfg = SHAPES_CFG(r["shape"])
        for test, tps in r.get("ultra", {}).items():
            if test.startswith("pp") or " x" in test:
                continue
            depth = int(test.split("@ d")[1].split()[0]) if "@ d" in test else 0
            b = bytes_per_token(cfg, depth, TYPE_BYTES[r["type"]])
            print(f"| {r['shape']} | {r['type']} | {test} | {tps:.1f} | {b / 1e6:.0f} | {tps * b / 1e9:.0f} | "
                  f"{100 * tps * b / bw:.0f}% | {100 * tps * b / result['copy_bw']:.0f}% |")


def run_ultra(args, key, path, cfg, r):
    """`ultra bench` on the model at path (HF directory or GGUF); results into r."""
    t0 = time.time()
    p = subprocess.run([args.ultra, "bench", "--device", "cuda", "-m", path, "-p", str(args.prompt), "-n",
                        str(args.gen), "-d", args.depths, "--parallel", args.parallel, "-r", str(args.reps),
                        "--json"], capture_output=True, text=True)
    if p.returncode != 0:
        r["ultra_error"] = p.stderr[-2000:]
        print(f"[{key}] ultra failed: {p.stderr[-2000:]}", flush=True)
    else:
        u = json.loads(p.stdout)
        r["ultra"] = {x["test"]: x["tps_mean"] for x in u["results"]}
        r["launch_us"] = u.get("launch_us_mean", 0)
        r["idle_us"] = u.get("gpu_idle_us_mean", 0)
        r["submit_us"] = u.get("decode_submit_us_mean", 0)
        pp = r["ultra"].get(f"pp{args.prompt}", 0)
        r["pp_tflops"] = pp * 2 * matmul_params(cfg) / 1e12
        print(f"[{key}] ultra ({time.time() - t0:.0f} s): {json.dumps(r['ultra'])}, launch "
              f"{r['launch_us']:.2f} us", flush=True)
    if args.profile:
        p = subprocess.run([args.ultra, "bench", "--device", "cuda", "-m", path, "-p", "0", "-n", "32", "-d", "128",
                            "-r", "1"], capture_output=True, text=True, env={**os.environ, "ULTRA_CUDA_PROFILE": "1"})
        r["profile"] = p.stderr[-4000:]
        print(f"[{key}] decode profile (d128):\n{p.stderr[-4000:]}", flush=True)


def SHAPES_CFG(shape):
    return make_config(shape)


if __name__ == "__main__":
    sys.exit(main())
