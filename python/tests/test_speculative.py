"""LLM(draft_model=..., lookup=...): speculative decoding through the C++ loop keeps the target's output
(greedy: the plain greedy tokens; seeded: repeatable), streams token by token, and stops on Ctrl-C."""

import _thread
import threading
import time

import pytest

import ultra
from conftest import DRAFT, N_CTX

PROMPTS = ["ROMEO:", "JULIET:\nO Romeo", "KING HENRY:"]


@pytest.fixture(scope="module")
def spec(model):
    return {"draft": ultra.LLM(model, n_ctx=N_CTX, n_slots=1, draft_model=str(DRAFT), n_draft=4),
            "lookup": ultra.LLM(model, n_ctx=N_CTX, n_slots=1, lookup=2)}


@pytest.mark.parametrize("kind", ["draft", "lookup"])
def test_greedy_speculative_equals_plain_greedy(llm, spec, kind):
    plain = llm.generate(PROMPTS, temperature=0, max_tokens=40, stop=["\n\n"])
    fast = spec[kind].generate(PROMPTS, temperature=0, max_tokens=40, stop=["\n\n"])
    for p, f in zip(plain, fast):
        assert f.token_ids == p.token_ids and f.text == p.text and f.finish_reason == p.finish_reason


def test_seeded_speculative_repeats_and_streams(spec):
    s = spec["draft"]
    a = s.complete("ROMEO:", seed=11, max_tokens=40)
    b = s.complete("ROMEO:", seed=11, max_tokens=40)
    assert a["choices"][0]["text"] == b["choices"][0]["text"]
    chunks = list(s.complete("ROMEO:", seed=11, max_tokens=40, stream=True))
    assert "".join(c["choices"][0]["text"] for c in chunks) == a["choices"][0]["text"]
    assert len(chunks) > 3  # token by token, not one piece at the end


def test_keyboard_interrupt_stops_speculative_generation(spec):
    s = spec["draft"]
    threading.Thread(target=lambda: (time.sleep(0.1), _thread.interrupt_main())).start()
    t0 = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        s.generate(["ROMEO:"] * 50, temperature=0.8, max_tokens=N_CTX - 8, ignore_eos=True)
    assert time.perf_counter() - t0 < 2.0
    assert s.generate("ROMEO:", temperature=0, max_tokens=4)[0].finish_reason == "length"
    with pytest.raises(ultra.InvalidArgument):
        ultra.LLM(s.model, lookup=-1)
