#!/usr/bin/env python3
"""ultra vs llama.cpp on the CPU, side by side in one script, same GGUF files and thread count.

For each weight type (f32, f16, q8_0; q4_k_m, q6_k, iq4_xs and llama.cpp's other mixes: llama-quantize of the
f16 file) it makes a random-weight ~110M-parameter Llama GGUF (dim 768,
12 layers, 12 heads, ffn 2048, vocab 32000, tied embeddings) with tools/make_bench_gguf.py (the low-bit
types fp8, ternary, tq2_0, tq1_0: `ultra quantize` of the f16 file; llama.cpp cannot load fp8 and ternary,
so their peer columns are empty), then runs `ultra bench` (prefill of P tokens, then G single-token decode
steps) and the peer on it, interleaved (one repetition of each in turn, `--reps` rounds; the best round of
each counts, since noise on a shared machine only slows a run down), and prints tokens/s, the ratio
ultra / llama.cpp, and the bytes/s each decode reaches against this machine's read bandwidth measured by
bench_matmul in the same run (weights read per token / time per token).

The peer (--peer):
  native  llama.cpp's llama-bench built from the source that the node-llama-cpp npm package ships
          (bench/node_modules/node-llama-cpp/llama/gitRelease.bundle), with -DGGML_NATIVE=ON so that it
          uses every instruction set of this CPU; cloned and built once into --llama-dir (default
          ~/.cache/ultra/llama.cpp-native, outside the repo), reused while its commit matches the bundle.
          If that build dies of SIGILL (its AMX Q8_0 kernel, on VMs that do not grant the tile state), the
          script switches to a build with every extension up to AVX-512 VNNI / BF16 but AMX
          (--llama-variant noamx) and says so.
  node    node-llama-cpp's prebuilt binary (bench/llamacpp_peer.mjs): generic, 2-3x slower on some CPUs;
          kept as the GGUF-compatibility check.

    python3 bench/cpu_compare.py [--arch llama|qwen3|gemma3|qwen3moe|qwen2moe|mixtral] [--threads 2] [--prompt 512] [--gen 128] [--reps 3] [--build build]
                                 [--peer native|node] [--llama-dir DIR] [--baseline OTHER_ULTRA_BINARY]
                                 [--no-peer] [--no-mmap] [--env K=V ...]
--arch picks the generator's preset (tools/make_bench_gguf.py --arch: llama, the default, writes
llama110m-tied-TYPE.gguf; qwen3 and gemma3 ~110M shapes with q/k norms, head_dim 128 and GQA write
ARCH-110m-TYPE.gguf; qwen3moe, qwen2moe and mixtral ~1B mixtures of experts, 8 experts of which 2 run, write
ARCH-1b-TYPE.gguf, and their bandwidth counts the bytes a token reads: the selected experts'), e.g.
python3 bench/cpu_compare.py --arch gemma3 --types f16,q8_0.
--baseline runs a second ultra binary (e.g. one built from an earlier commit) on the same files,
alternating with this build's, and prints this build / baseline: the before-and-after check of a change.
--env K=V sets an environment variable for ultra's runs only (A/B switches such as ULTRA_CPU_PANEL=0);
--no-mmap passes ultra's --no-mmap (the model read into huge-page memory).
Needs: a built tree (cmake --build build); `cd bench && npm ci` (the bundle, or the node peer); for the
native peer cmake, a C++ compiler and git.
"""
import argparse
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llamacpp_build import DEFAULT_LLAMA_DIR, llama_binary  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd, **kw):
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"command failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr[-2000:]}")
    return r.stdout


def llama_bench_binary(llama_dir, variant="native"):
    """llama-bench built natively (bench/llamacpp_build.py: cloned from node-llama-cpp's bundle, built once
    per variant: native, or noamx where the native build's AMX Q8_0 kernel dies of SIGILL)."""
    return llama_binary(llama_dir, "llama-bench", variant)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", choices=["llama", "qwen3", "gemma3", "qwen3moe", "qwen2moe", "mixtral"],
                    default="llama",
                    help="model shape written by tools/make_bench_gguf.py --arch")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--build", default="build")
    ap.add_argument("--dir", default="/tmp/ultra-bench")
    ap.add_argument("--types", default="f32,f16,q8_0")
    ap.add_argument("--baseline", help="another ultra binary to compare with, interleaved")
    ap.add_argument("--no-peer", action="store_true", help="skip llama.cpp")
    ap.add_argument("--peer", choices=["native", "node"], default="native")
    ap.add_argument("--llama-dir", default=DEFAULT_LLAMA_DIR)
    ap.add_argument("--llama-variant", choices=["native", "noamx"], default="native")
    ap.add_argument("--env", action="append", default=[], help="K=V for ultra's runs")
    ap.add_argument("--no-mmap", action="store_true", help="ultra bench --no-mmap")
    args = ap.parse_args()
    uenv = dict(os.environ)
    for kv in args.env:
        k, _, v = kv.partition("=")
        uenv[k] = v
    llama_bench = None
    if not args.no_peer and args.peer == "native":
        llama_bench = llama_bench_binary(args.llama_dir, args.llama_variant)
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8")
           if re.search(rf"\b{f}\b", flags)]
    print(f"CPU features: {' '.join(isa) or 'n/a'}; {args.threads} threads", flush=True)
    os.makedirs(args.dir, exist_ok=True)
    ultra = os.path.join(ROOT, args.build, "ultra")

    bw_out = run([os.path.join(ROOT, args.build, "bench_matmul"), "--threads", str(args.threads), "--bandwidth-only"])
    m = re.search(rf"read bandwidth, {args.threads} threads?: ([0-9.]+) GB/s", bw_out)
    bw = float(m.group(1)) * 1e9 if m else None
    print(f"read bandwidth ({args.threads} threads): {bw / 1e9:.1f} GB/s" if bw else "read bandwidth: n/a")

    rows = []
    lowbit = ("fp8", "ternary", "tq2_0", "tq1_0")
    # GGUF block types and llama.cpp's mixes, quantised from the f16 file by llama.cpp's own llama-quantize
    # (built from the same bundle as the peer), so both engines read the very same blocks.
    llama_types = ("q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k_s", "q3_k_m", "q3_k_l", "q4_k_s", "q4_k_m",
                   "q5_k_s", "q5_k_m", "q6_k", "iq4_nl", "iq4_xs")
    # the grid i-quants: llama-quantize wants an importance matrix for them (llama-imatrix of the f16 file over
    # tests/fixtures/bundled/val.txt; the weights are random, so any matrix serves the timing)
    grid_types = ("iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq1_s", "iq1_m")
    llama_types += grid_types
    moe = args.arch in ("qwen3moe", "qwen2moe", "mixtral")  # the generator's ~1B-parameter MoE presets
    stem = "llama110m-tied" if args.arch == "llama" else f"{args.arch}-1b" if moe else f"{args.arch}-110m"
    gen = [sys.executable, "tools/make_bench_gguf.py", "--arch", args.arch, "--tie-embeddings"]
    print(f"model: {args.arch} ({stem}-TYPE.gguf in {args.dir})", flush=True)
    for t in args.types.split(","):
        path = os.path.join(args.dir, f"{stem}-{t}.gguf")
        if not os.path.exists(path):
            if t in lowbit or t in llama_types:
                f16 = os.path.join(args.dir, f"{stem}-f16.gguf")
                if not os.path.exists(f16):
                    run(gen + ["--type", "f16", "-o", f16])
                if t in lowbit:
                    run([ultra, "quantize", f16, path, "--type", t])
                else:
                    quantize = llama_binary(args.llama_dir, "llama-quantize")
                    imat = []
                    if t in grid_types:
                        imatrix = os.path.join(args.dir, f"{stem}-imatrix.gguf")
                        if not os.path.exists(imatrix):
                            run([llama_binary(args.llama_dir, "llama-imatrix"), "-m", f16, "-f",
                                 os.path.join(ROOT, "tests/fixtures/bundled/val.txt"), "-c", "128", "--chunks", "4",
                                 "-t", str(args.threads), "-o", imatrix])
                        imat = ["--imatrix", imatrix]
                    run([quantize] + imat + [f16, path, t.upper()])
            else:
                run(gen + ["--type", t, "-o", path])
        def ultra_bench(binary, reps=args.reps):
            u = json.loads(run([binary, "bench", "-m", path, "-p", str(args.prompt), "-n", str(args.gen), "-r",
                                str(reps), "-t", str(args.threads), "--json"] + (["--no-mmap"] if args.no_mmap else []),
                           env=uenv))
            res = {r["test"]: r for r in u["results"]}
            return u, res[f"pp{args.prompt}"]["tps_mean"], res[f"tg{args.gen}"]["tps_mean"]

        def native_bench():
            nonlocal llama_bench
            cmd = [llama_bench, "-m", path, "-t", str(args.threads), "-p", str(args.prompt), "-n", str(args.gen),
                   "-r", "1", "-o", "json"]
            r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
            if r.returncode == -4 and args.llama_variant == "native":  # SIGILL: AMX without the tile state
                print("llama-bench (native) died of SIGILL (AMX); switching to the build without AMX", flush=True)
                args.llama_variant = "noamx"
                llama_bench = llama_bench_binary(args.llama_dir, "noamx")
                cmd[0] = llama_bench
                r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit(f"command failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr[-2000:]}")
            out = json.loads(r.stdout)
            pp = next(r["avg_ts"] for r in out if r["n_prompt"] == args.prompt and r["n_gen"] == 0)
            tg = next(r["avg_ts"] for r in out if r["n_gen"] == args.gen and r["n_prompt"] == 0)
            return pp, tg

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
        elif args.no_peer or args.peer == "node" or t in ("fp8", "ternary"):
            u, pp_u, tg_u = ultra_bench(ultra)
        if args.no_peer:
            continue
        if t in ("fp8", "ternary"):  # ultra's own GGUF types: llama.cpp refuses the file
            pp_l = tg_l = None
        elif args.peer == "native":
            # Interleaved: one repetition of each in turn; the best of each counts.
            pp_u = tg_u = pp_l = tg_l = 0.0
            for _ in range(args.reps):
                u, pp, tg = ultra_bench(ultra, reps=1)
                pp_u, tg_u = max(pp_u, pp), max(tg_u, tg)
                pp, tg = native_bench()
                pp_l, tg_l = max(pp_l, pp), max(tg_l, tg)
        else:
            p = json.loads(run(["node", "bench/llamacpp_peer.mjs", "--model", path, "--threads", str(args.threads),
                                "--prompt", str(args.prompt), "--gen", str(args.gen), "--reps", str(args.reps)]))
            pp_l = p["pp_tps_llama_mean"]
            tg_l = p["tg_tps_llama_mean"]
        # Every weight byte is read once per decoded token (tied: embd = output); of a mixture of experts, the
        # selected experts' only (active_bytes).
        bytes_tok = u.get("active_bytes", u["size_bytes"])
        peer = ("-" if pp_l is None else args.llama_variant) if args.peer == "native" else "node"
        row = dict(type=t, peer=peer, size_mb=bytes_tok / 1e6, tg_ultra=tg_u, tg_llama=tg_l, pp_ultra=pp_u, pp_llama=pp_l,
                   tg_ratio=tg_u / tg_l if tg_l else None, pp_ratio=pp_u / pp_l if pp_l else None,
                   bw_ultra=tg_u * bytes_tok / bw if bw else None,
                   bw_llama=tg_l * bytes_tok / bw if bw and tg_l else None)
        rows.append(row)
        print(json.dumps(row), flush=True)

    if not rows:
        return
    has = lambda f: re.search(rf"\b{f}\b", flags) is not None
    ultra_isa = ("avx512" if all(has(f) for f in ("avx512f", "avx512bw", "avx512vl", "avx512dq")) else
                 "avx2" if has("avx2") else "scalar")
    print(f"\nultra kernels: {ultra_isa} (its run-time choice on these CPU features); llama.cpp: "
          f"{'llama-bench (native, or noamx where the table says)' if args.peer == 'native' else 'node-llama-cpp prebuilt'}")
    print(f"\n| type | llama.cpp build | MB | tg{args.gen} ultra | tg{args.gen} llama.cpp | ratio | ultra % of bw | llama.cpp % of bw |"
          f" pp{args.prompt} ultra | pp{args.prompt} llama.cpp | ratio |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        pct = lambda x: f"{100 * x:.0f}%" if x is not None else "-"
        num = lambda x: f"{x:.1f}" if x is not None else "-"
        rat = lambda x: f"{x:.2f}x" if x is not None else "-"
        print(f"| {r['type']} | {r['peer']} | {r['size_mb']:.0f} | {r['tg_ultra']:.1f} | {num(r['tg_llama'])} | {rat(r['tg_ratio'])} |"
              f" {pct(r['bw_ultra'])} | {pct(r['bw_llama'])} | {r['pp_ultra']:.1f} | {num(r['pp_llama'])} |"
              f" {rat(r['pp_ratio'])} |")


if __name__ == "__main__":
    main()
