"""Perplexity from the logits: each window of the text is one step whose rows all ask for logits
(Output.logits), and -log p(next token) comes from a log-softmax over each row's NumPy view.

    python3 examples/python/perplexity.py [MODEL] [TEXT_FILE] [WINDOW] [MAX_WINDOWS]

`ultra perplexity -m MODEL -f TEXT_FILE --all-positions -c WINDOW [--chunks MAX_WINDOWS]` computes the same
number in C++.
"""

import pathlib
import sys

import numpy as np

import ultra

ROOT = pathlib.Path(__file__).resolve().parents[2]
model = ultra.Model(sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "models" / "target.gguf"))
text = pathlib.Path(sys.argv[2]).read_text() if len(sys.argv) > 2 else (ROOT / "README.md").read_text()
window = int(sys.argv[3]) if len(sys.argv) > 3 else 128
max_windows = int(sys.argv[4]) if len(sys.argv) > 4 else -1

ids = model.tokenizer.encode(text, add_special=False, parse_special=False)
ctx = ultra.Context(model, n_ctx=window, n_batch=window, n_outputs=window)
batch = ultra.Batch(window)
nll, n = 0.0, 0
for start in range(0, len(ids) - window + 1, window):
    if start // window == max_windows:
        break
    chunk = ids[start:start + window]
    ctx.clear(0)
    batch.clear()
    for pos, tok in enumerate(chunk):
        batch.add(tok, pos, 0, ultra.Output.logits)
    ctx.step(batch)
    for row in range(window - 1):
        logits = ctx.logits(row).astype(np.float64)  # a view until the next step; the sum is in double
        m = logits.max()
        logsumexp = m + np.log(np.exp(logits - m).sum())
        nll += logsumexp - logits[chunk[row + 1]]
        n += 1
    print(f"window {start // window + 1}: running perplexity {np.exp(nll / n):.4f}", file=sys.stderr)
print(f"perplexity over {n} tokens: {np.exp(nll / n):.4f}")
