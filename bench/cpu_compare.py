#!/usr/bin/env python3
"""ultra vs llama.cpp on the CPU, side by side in one script, same GGUF files and thread count.

For each weight type (f32, f16, q8_0) it makes a random-weight ~110M-parameter Llama GGUF (dim 768,
12 layers, 12 heads, ffn 2048, vocab 32000, tied embeddings) with tools/make_bench_gguf.py (the low-bit
types fp8, ternary, tq2_0, tq1_0: `ultra quantize` of the f16 file; llama.cpp cannot load fp8 and ternary,
so their peer columns are empty), runs
`ultra bench` (prefill of P tokens, then G single-token decode steps) and llama.cpp through
node-llama-cpp (bench/llamacpp_peer.mjs) on it, and prints decode/prefill tokens/s, the ratio
ultra / llama.cpp, and the bytes/s each decode reaches against this machine's read bandwidth measured by
bench_matmul in the same run (weights read per token / time per token).

    python3 bench/cpu_compare.py [--threads 2] [--prompt 128] [--gen 128] [--reps 3] [--build build]
                                 [--baseline OTHER_ULTRA_BINARY] [--no-peer]
--baseline runs a second ultra binary (e.g. one built from an earlier commit) on the same files,
alternating with this build's, and prints this build / baseline: the before-and-after check of a change.
Needs: a built tree (cmake --build build), and `cd bench && npm ci` (unless --no-peer).
"""
import argparse
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd, **kw):
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"command failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr[-2000:]}")
    return r.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--build", default="build")
    ap.add_argument("--dir", default="/tmp/ultra-bench")
    ap.add_argument("--types", default="f32,f16,q8_0")
    ap.add_argument("--baseline", help="another ultra binary to compare with, interleaved")
    ap.add_argument("--no-peer", action="store_true", help="skip llama.cpp")
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    ultra = os.path.join(ROOT, args.build, "ultra")

    bw_out = run([os.path.join(ROOT, args.build, "bench_matmul"), "--threads", str(args.threads), "--bandwidth-only"])
    m = re.search(rf"read bandwidth, {args.threads} threads?: ([0-9.]+) GB/s", bw_out)
    bw = float(m.group(1)) * 1e9 if m else None
    print(f"read bandwidth ({args.threads} threads): {bw / 1e9:.1f} GB/s" if bw else "read bandwidth: n/a")

    rows = []
    lowbit = ("fp8", "ternary", "tq2_0", "tq1_0")
    for t in args.types.split(","):
        path = os.path.join(args.dir, f"llama110m-tied-{t}.gguf")
        if not os.path.exists(path):
            if t in lowbit:
                f16 = os.path.join(args.dir, "llama110m-tied-f16.gguf")
                if not os.path.exists(f16):
                    run([sys.executable, "tools/make_bench_gguf.py", "--type", "f16", "--tie-embeddings", "-o", f16])
                run([ultra, "quantize", f16, path, "--type", t])
            else:
                run([sys.executable, "tools/make_bench_gguf.py", "--type", t, "--tie-embeddings", "-o", path])
        def ultra_bench(binary):
            u = json.loads(run([binary, "bench", "-m", path, "-p", str(args.prompt), "-n", str(args.gen), "-r",
                                str(args.reps), "-t", str(args.threads), "--json"]))
            res = {r["test"]: r for r in u["results"]}
            return u, res[f"pp{args.prompt}"]["tps_mean"], res[f"tg{args.gen}"]["tps_mean"]

        if args.baseline:
            # Alternate baseline and this build twice and keep each one's better run (noise is one-sided).
            pp_b = tg_b = pp_u = tg_u = 0.0
            for _ in range(2):
                _, pp, tg = ultra_bench(args.baseline)
                pp_b, tg_b = max(pp_b, pp), max(tg_b, tg)
                u, pp, tg = ultra_bench(ultra)
                pp_u, tg_u = max(pp_u, pp), max(tg_u, tg)
            print(json.dumps(dict(type=t, tg_new=tg_u, tg_baseline=tg_b, tg_ratio=tg_u / tg_b, pp_new=pp_u,
                                  pp_baseline=pp_b, pp_ratio=pp_u / pp_b)), flush=True)
        else:
            u, pp_u, tg_u = ultra_bench(ultra)
        if args.no_peer:
            continue
        if t in ("fp8", "ternary"):  # ultra's own GGUF types: llama.cpp refuses the file
            pp_l = tg_l = None
        else:
            p = json.loads(run(["node", "bench/llamacpp_peer.mjs", "--model", path, "--threads", str(args.threads),
                                "--prompt", str(args.prompt), "--gen", str(args.gen), "--reps", str(args.reps)]))
            pp_l = p["pp_tps_llama_mean"]
            tg_l = p["tg_tps_llama_mean"]
        bytes_tok = u["size_bytes"]  # every weight byte is read once per decoded token (tied: embd = output)
        row = dict(type=t, size_mb=bytes_tok / 1e6, tg_ultra=tg_u, tg_llama=tg_l, pp_ultra=pp_u, pp_llama=pp_l,
                   tg_ratio=tg_u / tg_l if tg_l else None, pp_ratio=pp_u / pp_l if pp_l else None,
                   bw_ultra=tg_u * bytes_tok / bw if bw else None,
                   bw_llama=tg_l * bytes_tok / bw if bw and tg_l else None)
        rows.append(row)
        print(json.dumps(row), flush=True)

    if not rows:
        return
    print(f"\n| type | MB | tg{args.gen} ultra | tg{args.gen} llama.cpp | ratio | ultra % of bw | llama.cpp % of bw |"
          f" pp{args.prompt} ultra | pp{args.prompt} llama.cpp | ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        pct = lambda x: f"{100 * x:.0f}%" if x is not None else "-"
        num = lambda x: f"{x:.1f}" if x is not None else "-"
        rat = lambda x: f"{x:.2f}x" if x is not None else "-"
        print(f"| {r['type']} | {r['size_mb']:.0f} | {r['tg_ultra']:.1f} | {num(r['tg_llama'])} | {rat(r['tg_ratio'])} |"
              f" {pct(r['bw_ultra'])} | {pct(r['bw_llama'])} | {r['pp_ultra']:.1f} | {num(r['pp_llama'])} |"
              f" {rat(r['pp_ratio'])} |")


if __name__ == "__main__":
    main()
