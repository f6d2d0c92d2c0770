"""1000 generate calls keep the process's resident memory flat: nothing leaks through the bindings (the
Python objects of each call, the TextStream / StopStrings of each request, the logits views)."""

import os

import ultra
from conftest import DRAFT


def rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def test_a_thousand_generate_calls_keep_rss_flat():
    # The bundled draft model (2.7 MB): the bindings are the same, the steps ten times cheaper.
    model = ultra.Model(str(DRAFT))
    llm = ultra.LLM(model, n_ctx=32, n_slots=1, threads=1)
    ids = model.tokenizer.encode("ROMEO:")

    def calls(n):
        for i in range(n):
            # Mostly the prompt's step alone; every fourth call a decode step too (kept short for CI time).
            out = llm.generate([ids], temperature=0.5, seed=i, max_tokens=1 + (i % 4 == 0), stop=["x"])[0]
            assert len(out.token_ids) >= 1
            # A view of the last step's logits (its one output row), dropped at once.
            llm.ctx.logits(len(ids) - 1 if len(out.token_ids) == 1 else 0)

    calls(100)  # warm up: allocator pools, pybind11's type caches
    before = rss_kib()
    calls(1000)
    grown = rss_kib() - before
    # A leak of one small object per call (>= 64 bytes) would add at least 64 KiB here; a leaked request's
    # text stream and stop strings far more.
    assert grown < 256, f"RSS grew by {grown} KiB over 1000 calls"
