"""The Python package computes what the command computes: greedy tokens and logits bit for bit against
`ultra run --dump-logits`, seeded sampling against `ultra run -s`, and generate over many prompts (continuous
batching over the slots) against one call per prompt."""

import json

import numpy as np
import pytest

import ultra
from conftest import DRAFT, N_CTX, TARGET, run_cli


def cli_greedy(path, prompt, n, tmp_path):
    dump = tmp_path / "logits.f32"
    out = run_cli("run", "-m", str(path), "-p", prompt, "-n", str(n), "-c", str(N_CTX), "--temp", "0",
                  "--ignore-eos", "--json", "--dump-logits", str(dump))
    j = json.loads(out.stdout)
    return j, np.fromfile(dump, dtype="<f4")


@pytest.mark.parametrize("path", [TARGET, DRAFT], ids=["target", "draft"])
def test_greedy_tokens_and_logits_equal_ultra_run(path, tmp_path):
    prompt, n = "ROMEO:\nWhat light", 12
    j, cli_logits = cli_greedy(path, prompt, n, tmp_path)
    model = ultra.Model(str(path))
    ids = model.tokenizer.encode(prompt)
    assert ids == j["prompt_ids"]

    # The low-level API: one prefill step, then one decode step per token.
    ctx = ultra.Context(model, n_ctx=N_CTX)
    ctx.set_sampling(0, ultra.SamplingParams.greedy())
    batch = ultra.Batch(ctx.n_batch)
    batch.add_sequence(ids, 0, 0, ultra.Output.sample)
    ctx.step(batch)
    row = len(batch) - 1
    tokens, logits = [], []
    for i in range(n):
        tokens.append(ctx.sampled(row))
        logits.append(np.array(ctx.logits(row)))  # a copy: the view is valid until the next step
        batch.clear()
        row = batch.add(tokens[-1], len(ids) + i, 0, ultra.Output.sample)
        ctx.step(batch)
    assert tokens == j["generated_ids"]
    mine = np.concatenate(logits)
    assert mine.shape == cli_logits.shape
    assert np.array_equal(mine.view(np.uint32), cli_logits.view(np.uint32))  # bit for bit

    # The high-level API, greedy.
    out = ultra.LLM(model, n_ctx=N_CTX, n_slots=2).generate(prompt, temperature=0, max_tokens=n, ignore_eos=True)
    assert out[0].token_ids == j["generated_ids"]
    assert out[0].text == j["generated_text"]
    assert out[0].finish_reason == "length"


def test_logits_view_is_the_contexts_buffer(model):
    ctx = ultra.Context(model, n_ctx=64)
    batch = ultra.Batch(8)
    batch.add_sequence([1, 2, 3], 0, 0, ultra.Output.logits)
    ctx.step(batch)
    a = ctx.logits(2)
    b = ctx.logits(2)
    assert a.dtype == np.float32 and a.shape == (model.n_vocab,)
    assert a.ctypes.data == b.ctypes.data  # no copy: both view the context's buffer
    assert not a.flags.writeable
    with pytest.raises(ValueError):
        a[0] = 1.0


def test_seeded_sampling_equals_ultra_run_and_repeats(llm):
    prompt = "JULIET:"
    out = run_cli("run", "-m", str(TARGET), "-p", prompt, "-n", "24", "-c", str(N_CTX), "-s", "42", "--temp",
                  "0.9", "--ignore-eos", "--json")
    j = json.loads(out.stdout)
    a = llm.generate(prompt, seed=42, temperature=0.9, max_tokens=24, ignore_eos=True)[0]
    b = llm.generate(prompt, seed=42, temperature=0.9, max_tokens=24, ignore_eos=True)[0]
    c = llm.generate(prompt, seed=43, temperature=0.9, max_tokens=24, ignore_eos=True)[0]
    assert a.token_ids == j["generated_ids"]
    assert a.token_ids == b.token_ids and a.text == b.text
    assert a.token_ids != c.token_ids


PROMPTS = ["ROMEO:", "JULIET:\nO Romeo", "KING HENRY:", "First Citizen:\nBefore we proceed",
           "And God said", "HAMLET:", "MERCUTIO:\nNay", "In the beginning"]


@pytest.mark.parametrize("temperature", [0.0, 0.8], ids=["greedy", "seeded"])
def test_generate_eight_prompts_equals_eight_runs(llm, temperature):
    # Different lengths, so that slots finish at different steps and take the waiting prompts mid-run.
    sps = [ultra.SamplingParams(temperature=temperature, seed=100 + i) for i in range(len(PROMPTS))]
    together = llm.generate(PROMPTS, sps, max_tokens=20, stop=["\n\n"])
    assert len(together) == 8
    for i, p in enumerate(PROMPTS):
        alone = llm.generate(p, sps[i], max_tokens=20, stop=["\n\n"])[0]
        assert together[i].index == i
        assert together[i].token_ids == alone.token_ids, p
        assert together[i].text == alone.text
        assert together[i].finish_reason == alone.finish_reason
    assert {o.finish_reason for o in together} <= {"stop", "length"}


def test_perplexity_equals_ultra_perplexity_and_a_numpy_loop(model):
    text = (TARGET.parent / "README.md").read_text()
    out = run_cli("perplexity", "-m", str(TARGET), "-f", str(TARGET.parent / "README.md"), "--all-positions",
                  "-c", "64", "--chunks", "3", "--json")
    cli = json.loads(out.stdout)
    ids = model.tokenizer.encode(text, add_special=False, parse_special=False)
    ctx = ultra.Context(model, n_ctx=64, n_batch=64, n_outputs=64)
    r = ultra.perplexity(ctx, ids, n_window=64, all_positions=True, max_windows=3)
    assert r["ppl"] == cli["ppl"] and r["n_scored"] == cli["n_tokens_scored"]
    # The same number from the logits in Python (examples/python/perplexity.py's loop).
    batch = ultra.Batch(64)
    nll = 0.0
    for w in range(3):
        chunk = ids[64 * w:64 * (w + 1)]
        ctx.clear(0)
        batch.clear()
        for pos, tok in enumerate(chunk):  # every row asks for its logits
            batch.add(tok, pos, 0, ultra.Output.logits)
        ctx.step(batch)
        for row in range(63):
            x = ctx.logits(row).astype(np.float64)
            m = x.max()
            nll += m + np.log(np.exp(x - m).sum()) - x[chunk[row + 1]]
    assert abs(np.exp(nll / (3 * 63)) - r["ppl"]) < 1e-9 * r["ppl"]
