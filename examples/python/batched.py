"""Many prompts through the context's slots at once (continuous batching: a slot that finishes takes the
next prompt), with per-prompt results and timings.

    python3 examples/python/batched.py [MODEL] [N_PROMPTS] [N_SLOTS]
"""

import pathlib
import sys
import time

import ultra

MODEL = str(pathlib.Path(__file__).resolve().parents[2] / "models" / "target.gguf")

model = sys.argv[1] if len(sys.argv) > 1 else MODEL
n_prompts = int(sys.argv[2]) if len(sys.argv) > 2 else 16
n_slots = int(sys.argv[3]) if len(sys.argv) > 3 else 8

names = ["ROMEO", "JULIET", "HAMLET", "KING HENRY", "MERCUTIO", "NURSE", "FRIAR LAURENCE", "TYBALT"]
prompts = [f"{names[i % len(names)]}:\n" for i in range(n_prompts)]
llm = ultra.LLM(model, n_slots=n_slots)
sampling = [ultra.SamplingParams(temperature=0.8, seed=i) for i in range(n_prompts)]  # one seed per prompt

t0 = time.perf_counter()
outs = llm.generate(prompts, sampling, max_tokens=48, stop=["\n\n"])
wall = time.perf_counter() - t0
for o in outs:
    print(f"--- {o.index} ({o.finish_reason}, {len(o.token_ids)} tokens, first token after "
          f"{o.timings['queued_ms'] + o.timings['prompt_ms']:.1f} ms)")
    print(o.prompt + o.text)
n = sum(len(o.token_ids) for o in outs)
print(f"\n{n_prompts} prompts over {n_slots} slots: {n} tokens in {wall:.2f} s ({n / wall:.1f} tokens/s)",
      file=sys.stderr)
