"""Generate text from one prompt.

    python3 examples/python/generate.py [MODEL] [PROMPT] [MAX_TOKENS]
"""

import pathlib
import sys

import ultra

MODEL = str(pathlib.Path(__file__).resolve().parents[2] / "models" / "target.gguf")

model = sys.argv[1] if len(sys.argv) > 1 else MODEL
prompt = sys.argv[2] if len(sys.argv) > 2 else "ROMEO:"
max_tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 64

llm = ultra.LLM(model, n_slots=1)
out = llm.generate(prompt, temperature=0.7, seed=1, max_tokens=max_tokens)[0]
print(prompt + out.text)
print(f"\n[{out.finish_reason}; {out.timings['n_generated']} tokens, {out.timings['tokens_per_s']:.1f} tokens/s]",
      file=sys.stderr)
