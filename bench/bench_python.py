"""Tokens/s through the Python package against the `ultra` command, on the CPU, same model and settings.

    PYTHONPATH=build/python python3 bench/bench_python.py [--model M] [--tokens N] [--threads T] [--repeats R]

Measured (greedy, --ignore-eos, the same prompt, context and threads everywhere; best of R runs each,
alternating, so that a busy machine hurts every side alike):
  ultra run         `ultra run --json`'s eval_tps: decode tokens after the first / decode time (C++ loop)
  LLM.generate      GenerationOutput.timings: (n - 1) / decode_ms, the same definition
  complete(stream)  wall time from the first chunk to the last, n - 1 tokens (chunk dicts built per token)
  per-token cost    1e6 / py_tps - 1e6 / cli_tps, in microseconds; and in-process: the wall time per
                    decode step less the C++ step time (Context.stats forward_ms + sample_ms), which is
                    the loop's Python cost without the variance between two processes
  32 prompts        LLM.generate over 32 prompts in 8 slots: C++ step time / wall time, the share a loop
                    with no host cost (the same steps driven from C++) would keep
"""

import argparse
import json
import pathlib
import subprocess
import sys
import time

import ultra

ROOT = pathlib.Path(__file__).resolve().parents[1]


def cli_tps(exe, model, prompt, n, n_ctx, threads):
    out = subprocess.run([exe, "run", "-m", model, "-p", prompt, "-n", str(n), "-c", str(n_ctx), "-t",
                          str(threads), "--temp", "0", "--ignore-eos", "--json"],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["timings"]["eval_tps"]


def step_ms(ctx):
    s = ctx.stats
    return s["forward_ms"] + s["sample_ms"], s["n_steps"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=str(ROOT / "models" / "target.gguf"))
    ap.add_argument("--ultra", default=str(ROOT / "build" / "ultra"), help="the ultra command")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: all)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--prompt", default="ROMEO:")
    a = ap.parse_args()
    n_ctx = a.tokens + 64

    llm = ultra.LLM(a.model, n_ctx=n_ctx, n_slots=1, threads=a.threads)
    threads = llm.ctx.threads
    best = {"cli": 0.0, "generate": 0.0, "stream": 0.0}
    overhead_us = []
    for _ in range(a.repeats):
        best["cli"] = max(best["cli"], cli_tps(a.ultra, a.model, a.prompt, a.tokens, n_ctx, threads))

        c0, s0 = step_ms(llm.ctx)
        out = llm.generate(a.prompt, temperature=0, max_tokens=a.tokens, ignore_eos=True)[0]
        c1, s1 = step_ms(llm.ctx)
        t = out.timings
        best["generate"] = max(best["generate"], t["tokens_per_s"])
        # In process: wall per step less the C++ time inside the steps (prefill step included in both).
        wall_ms = t["prompt_ms"] + t["decode_ms"]
        overhead_us.append((wall_ms - (c1 - c0)) * 1e3 / (s1 - s0))

        chunks = llm.complete(a.prompt, temperature=0, max_tokens=a.tokens, ignore_eos=True, stream=True)
        next(chunks)
        t0 = time.perf_counter()
        n = 1 + sum(1 for c in chunks if c["choices"][0]["finish_reason"] is None)
        dt = time.perf_counter() - t0
        best["stream"] = max(best["stream"], (n - 1) / dt)

    cli = best["cli"]
    print(f"model {pathlib.Path(a.model).name}, {a.tokens} tokens, greedy, CPU, {threads} threads, "
          f"best of {a.repeats}")
    print(f"  ultra run         {cli:9.1f} tokens/s")
    for k, name in (("generate", "LLM.generate"), ("stream", "complete(stream)")):
        v = best[k]
        print(f"  {name:17s} {v:9.1f} tokens/s  {100 * v / cli:6.1f}% of ultra run  "
              f"{1e6 / v - 1e6 / cli:+7.1f} us per token")
    overhead_us.sort()
    print(f"  in-process Python cost per decode step (LLM.generate): {overhead_us[len(overhead_us) // 2]:.1f} us "
          f"(median), {overhead_us[0]:.1f} us (best)")

    prompts = [f"{name}:\n" for name in ("ROMEO", "JULIET", "HAMLET", "NURSE")] * 8
    big = ultra.LLM(a.model, n_ctx=n_ctx, n_slots=8, threads=threads)
    shares = []
    for _ in range(a.repeats):
        c0, s0 = step_ms(big.ctx)
        t0 = time.perf_counter()
        outs = big.generate(prompts, [ultra.SamplingParams(temperature=0.8, seed=i) for i in range(32)],
                            max_tokens=64, ignore_eos=True)
        wall = time.perf_counter() - t0
        c1, s1 = step_ms(big.ctx)
        shares.append(((c1 - c0) / 1e3 / wall, sum(len(o.token_ids) for o in outs) / wall, s1 - s0, wall))
    share, tps, steps, wall = max(shares)
    print(f"  32 prompts, 8 slots, 64 tokens each: {tps:.1f} tokens/s, {steps} steps in {wall:.2f} s; "
          f"C++ step time is {100 * share:.1f}% of the wall time "
          f"({(1 - share) * wall * 1e6 / steps:.1f} us of Python per step)")


if __name__ == "__main__":
    sys.exit(main())
