#!/usr/bin/env python3
"""A/B of the CUDA decode step's launch modes and fusions, interleaved in one run on the same weights.

For each shape (random weights made with transformers, as bench/cuda_compare.py does) and each variant,
`ultra bench --device cuda -p 0 -n G -d D --parallel 1 -r R --json` under the variant's environment:
  old        ULTRA_CUDA_PDL=1 ULTRA_CUDA_FUSE=0: programmatic launch for the sampler and split-K gemv only,
             RoPE + KV write as separate kernels (the step before these changes)
  pdl        ULTRA_CUDA_PDL=2 ULTRA_CUDA_FUSE=0: every kernel but attention with programmatic launch
  pdl+rkv    ULTRA_CUDA_PDL=2 ULTRA_CUDA_FUSE=1: RoPE and the KV write in one kernel (the default)
  +attn      pdl+rkv plus attention with programmatic launch (ULTRA_CUDA_ATTENTION_PDL=1)
  default    the defaults
  colsplit   every gemv through the column-split kernel (ULTRA_CUDA_GEMV=1); splitk: the split-K one (2)
  late       gemv kernels trigger the next launch after their loads (ULTRA_CUDA_GEMV_TRIGGER=2)
  chunkN     the default with attention splits of at least N positions (ULTRA_CUDA_ATTN_CHUNK)
  attn-nopdl attention's two kernels launched the ordinary way (ULTRA_CUDA_ATTENTION_PDL=0; the default
             launches both programmatically); cpdl-only: only the merge kernel programmatically
             (ULTRA_CUDA_ATTN_COMBINE_PDL=1); attn-trigN: the split kernel lets the next kernel launch at its
             start (0) or after its tiles (1) instead of at exit (ULTRA_CUDA_ATTN_TRIGGER)
  stream     every one-row gemv through the weight-streaming kernel (ULTRA_CUDA_GEMV=3), x and its slots in
             the default 192 KB, 96 KB or 48 KB of shared memory (ULTRA_CUDA_GEMV_SMEM)
  norm-only, swiglu-only, head-only: one of those fusions each (ULTRA_CUDA_FUSE=5, 9, 17)
  no-prologue the rmsnorms, silu_mul and the LM head's gather as their own kernels (ULTRA_CUDA_FUSE=1; the
             default fuses them into the x of the streaming gemv after them)
(Removed after their measurements, docs/CUDA.md "Tuning switches": silu_mul fused into the column-split
down projection, ULTRA_CUDA_FUSE bit 2; the automatic choice without the streaming kernel,
ULTRA_CUDA_GEMV_STREAM=0; step IO by copy nodes, ULTRA_CUDA_STEP_IO=copy; unqueued steps, ULTRA_BENCH_QUEUE=0.)
Variants run round-robin, `--rounds` times, so drift of the machine hits all of them alike. Prints tok/s
(best and mean over rounds), % of the read roofline (bytes per token over the read bandwidth measured in
the same run), the host's time per step (the graph launch call, and all of submit()) and the GPU's idle
time between steps.

    python3 bench/decode_ab.py --ultra .devbin/ultra [--shapes 8b,1b] [--depth 128] [--rounds 2]
"""
import argparse
import json
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cuda_compare as cc  # noqa: E402

VARIANTS = [
    ("old", {"ULTRA_CUDA_PDL": "1", "ULTRA_CUDA_FUSE": "0", "ULTRA_CUDA_ATTENTION_PDL": "0"}),
    ("pdl", {"ULTRA_CUDA_PDL": "2", "ULTRA_CUDA_FUSE": "0", "ULTRA_CUDA_ATTENTION_PDL": "0"}),
    ("pdl+rkv", {"ULTRA_CUDA_PDL": "2", "ULTRA_CUDA_FUSE": "1", "ULTRA_CUDA_ATTENTION_PDL": "0"}),
    ("+attn", {"ULTRA_CUDA_PDL": "2", "ULTRA_CUDA_FUSE": "1", "ULTRA_CUDA_ATTENTION_PDL": "1"}),
    ("default", {}),
    ("colsplit", {"ULTRA_CUDA_GEMV": "1"}),
    ("splitk", {"ULTRA_CUDA_GEMV": "2"}),
    ("late", {"ULTRA_CUDA_GEMV_TRIGGER": "2"}),
    ("colsplit-late", {"ULTRA_CUDA_GEMV": "1", "ULTRA_CUDA_GEMV_TRIGGER": "2"}),
    ("gemv-l2", {"ULTRA_CUDA_GEMV_L2": "1"}),
    ("pdl1", {"ULTRA_CUDA_PDL": "1"}),
    ("gemv-l1", {"ULTRA_CUDA_GEMV_L1": "1"}),
    ("chunk64", {"ULTRA_CUDA_ATTN_CHUNK": "64"}),
    ("chunk256", {"ULTRA_CUDA_ATTN_CHUNK": "256"}),
    ("chunk1024", {"ULTRA_CUDA_ATTN_CHUNK": "1024"}),
    ("attn-nopdl", {"ULTRA_CUDA_ATTENTION_PDL": "0"}),
    ("cpdl-only", {"ULTRA_CUDA_ATTENTION_PDL": "0", "ULTRA_CUDA_ATTN_COMBINE_PDL": "1"}),
    ("attn-trig0", {"ULTRA_CUDA_ATTN_TRIGGER": "0"}),
    ("attn-trig1", {"ULTRA_CUDA_ATTN_TRIGGER": "1"}),
    ("stream", {"ULTRA_CUDA_GEMV": "3"}),
    ("no-prologue", {"ULTRA_CUDA_FUSE": "1"}),
    ("norm-only", {"ULTRA_CUDA_FUSE": "5"}),
    ("swiglu-only", {"ULTRA_CUDA_FUSE": "9"}),
    ("head-only", {"ULTRA_CUDA_FUSE": "17"}),
    ("stream-96K", {"ULTRA_CUDA_GEMV": "3", "ULTRA_CUDA_GEMV_SMEM": "98304"}),
    ("stream-48K", {"ULTRA_CUDA_GEMV": "3", "ULTRA_CUDA_GEMV_SMEM": "49152"}),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ultra", default="build/ultra")
    ap.add_argument("--shapes", default="8b,1b")
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--depth", default="128", help="context depths, comma-separated")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=1, help="sequences decoded together")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--variants", default=",".join(v[0] for v in VARIANTS))
    ap.add_argument("--skip-sets", default="",
                    help="instead of the variants: the default step with ULTRA_CUDA_SKIP set to each of these "
                         "';'-separated op lists ('none' for the full step): what each op costs in the graph")
    ap.add_argument("--dir", default="/tmp/ultra-cuda-bench")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    args = ap.parse_args()
    bw = cc.read_bandwidth()
    print(f"{torch.cuda.get_device_name()}: read {bw / 1e12:.2f} TB/s", flush=True)
    want = args.variants.split(",")
    variants = [v for v in VARIANTS if v[0] in want]
    if args.skip_sets:
        variants = [(k, {"ULTRA_CUDA_SKIP": "" if k == "none" else k}) for k in args.skip_sets.split(";")]
    rows = []
    for shape in args.shapes.split(","):
        path = os.path.join(args.dir, shape)
        os.makedirs(path, exist_ok=True)
        cfg, model = cc.make_model(shape, path)
        del model
        torch.cuda.empty_cache()
        for depth in [int(d) for d in args.depth.split(",")]:
            bpt = cc.bytes_per_token(cfg, depth)
            res = {name: [] for name, _ in variants}
            launch = {name: [] for name, _ in variants}
            submit = {name: [] for name, _ in variants}
            idle = {name: [] for name, _ in variants}
            for rnd in range(args.rounds):
                for name, env in variants:
                    p = subprocess.run([args.ultra, "bench", "--device", "cuda", "-m", path, "-p", "0", "-n",
                                        str(args.gen), "-d", str(depth), "--parallel", str(args.parallel), "-r", str(args.reps),
                                        "--json"], capture_output=True, text=True, env={**os.environ, **env})
                    if p.returncode != 0:
                        print(f"[{shape}] {name}: ultra failed: {p.stderr[-1500:]}", flush=True)
                        continue
                    u = json.loads(p.stdout)
                    tps = [x["tps_mean"] for x in u["results"] if x["test"].startswith("tg")][0]  # aggregate
                    res[name].append(tps)
                    launch[name].append(u.get("launch_us_mean", 0))
                    submit[name].append(u.get("decode_submit_us_mean", 0))
                    idle[name].append(u.get("gpu_idle_us_mean", 0))
                    print(f"[{shape} d{depth}] round {rnd} {name:24s} {tps:8.1f} tok/s  "
                          f"{100 * tps * bpt / bw:5.1f}% of read  launch {launch[name][-1]:.2f} us  "
                          f"submit {submit[name][-1]:.2f} us  GPU idle {idle[name][-1]:.2f} us", flush=True)
            for name, _ in variants:
                if not res[name]:
                    continue
                best, mean = max(res[name]), sum(res[name]) / len(res[name])
                avg = lambda v: sum(v[name]) / len(v[name])  # noqa: E731
                rows.append((f"{shape} d{depth}", name, best, mean, 100 * best * bpt / bw, avg(launch),
                             avg(submit), avg(idle)))
    print("\n| shape | variant | tok/s best | tok/s mean | % read roofline (best) | host launch us | host submit us "
          "| GPU idle us |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]:.1f} | {r[3]:.1f} | {r[4]:.1f}% | {r[5]:.2f} | {r[6]:.2f} | {r[7]:.2f} |")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "decode_ab.json"), "w") as f:
        json.dump(dict(read_bw=bw, rows=rows), f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
