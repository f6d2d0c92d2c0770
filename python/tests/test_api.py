"""The high-level API's behaviour: streaming equals the whole answer, chat renders what the server renders,
bad input raises the documented exception, and Ctrl-C ends a generation within one step."""

import _thread
import json
import re
import subprocess
import threading
import time
import urllib.request

import numpy as np
import pytest

import ultra
from conftest import N_CTX, TARGET, ultra_bin

MESSAGES = [{"role": "system", "content": "A play."}, {"role": "user", "content": "Speak, ROMEO."},
            {"role": "assistant", "content": "What light through yonder window breaks?"},
            {"role": "user", "content": [{"type": "text", "text": "Go on"}, {"type": "text", "text": "!"}]}]


def test_streaming_concatenates_to_the_whole_completion(llm):
    for stop in (None, ["\n\n"], ["thee"]):
        whole = llm.complete("ROMEO:", seed=7, max_tokens=48, stop=stop)
        chunks = list(llm.complete("ROMEO:", seed=7, max_tokens=48, stop=stop, stream=True))
        assert all(c["object"] == "text_completion" for c in chunks)
        assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
        assert chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
        assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
        if stop:
            assert stop[0] not in whole["choices"][0]["text"]
    assert whole["usage"]["prompt_tokens"] == len(llm.tokenize("ROMEO:"))


def test_chat_streaming_concatenates_to_the_whole_chat(llm):
    whole = llm.chat(MESSAGES, seed=3, max_tokens=32)
    assert whole["object"] == "chat.completion"
    assert whole["choices"][0]["message"]["role"] == "assistant"
    chunks = list(llm.chat(MESSAGES, seed=3, max_tokens=32, stream=True))
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == whole["choices"][0]["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]


@pytest.fixture(scope="module")
def server():
    proc = subprocess.Popen([ultra_bin(), "serve", "-m", str(TARGET), "--port", "0", "-c", str(N_CTX),
                             "--parallel", "1"], stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        m = re.search(r"http://([^:]+):(\d+)", line)
        assert m, line
        url = f"http://{m.group(1)}:{m.group(2)}"
        for _ in range(200):
            try:
                urllib.request.urlopen(url + "/health", timeout=1)
                break
            except OSError:
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def post(url, body):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=30).read())


def test_chat_renders_and_answers_as_the_server(llm, server):
    assert llm.chat_prompt(MESSAGES) == post(server + "/apply-template", {"messages": MESSAGES})["prompt"]
    mine = llm.chat(MESSAGES, temperature=0, max_tokens=24)
    theirs = post(server + "/v1/chat/completions", {"messages": MESSAGES, "temperature": 0, "max_tokens": 24})
    assert mine["choices"][0]["message"] == theirs["choices"][0]["message"]
    assert mine["choices"][0]["finish_reason"] == theirs["choices"][0]["finish_reason"]
    assert mine["usage"] == {k: theirs["usage"][k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
    mine = llm.complete("KING HENRY:", temperature=0, max_tokens=24, stop=["\n"])
    theirs = post(server + "/v1/completions",
                  {"prompt": "KING HENRY:", "temperature": 0, "max_tokens": 24, "stop": ["\n"]})
    assert mine["choices"][0]["text"] == theirs["choices"][0]["text"]
    assert set(theirs) <= set(mine)


def test_bad_input_raises_the_documented_exception(model, llm, tmp_path):
    assert issubclass(ultra.ModelError, ultra.Error) and issubclass(ultra.Error, RuntimeError)
    assert issubclass(ultra.InvalidArgument, ultra.Error) and issubclass(ultra.InvalidArgument, ValueError)
    with pytest.raises(ultra.ModelError, match="missing.gguf"):
        ultra.Model(str(tmp_path / "missing.gguf"))
    (tmp_path / "junk.gguf").write_bytes(b"GGUF" + b"\x00" * 20)
    with pytest.raises(ultra.ModelError):
        ultra.Model(str(tmp_path / "junk.gguf"))
    with pytest.raises(TypeError):
        ultra.Model(42)
    with pytest.raises(ultra.InvalidArgument, match="n_ctx"):
        ultra.Context(model, n_ctx=-1)
    with pytest.raises(ultra.InvalidArgument, match="n_slots"):
        ultra.Context(model, n_slots=0)
    with pytest.raises(ultra.InvalidArgument, match="device"):
        ultra.Context(model, device="tpu")
    with pytest.raises(TypeError):
        ultra.Context(model, n_ctx="big")
    with pytest.raises(ultra.InvalidArgument):
        model.tokenizer.decode([model.tokenizer.n_vocab])
    with pytest.raises(TypeError):
        model.tokenizer.decode(["a"])
    with pytest.raises(ultra.InvalidArgument):
        model.tokenizer.is_special(model.tokenizer.n_vocab)
    with pytest.raises(ultra.InvalidArgument):
        model.tokenizer.token_to_piece(-1)
    with pytest.raises(ultra.ModelError, match="nonexistent"):
        ultra.Tokenizer.load("/nonexistent/tokenizer.json")
    with pytest.raises(ultra.InvalidArgument, match="chat template"):
        ultra.ChatFormatter(model, "{% if %}")
    with pytest.raises(ultra.InvalidArgument, match="temperature"):
        ultra.SamplingParams(temperature=-1)
    with pytest.raises(ultra.InvalidArgument):
        ultra.SamplingParams(top_p=float("nan"))
    with pytest.raises(TypeError):
        ultra.SamplingParams(temprature=0.5)
    with pytest.raises(TypeError):
        ultra.SamplingParams(0.5)  # keyword arguments only

    ctx = ultra.Context(model, n_ctx=32)
    batch = ultra.Batch(4)
    batch.add(model.n_vocab, 0, 0, ultra.Output.sample)  # past the vocabulary: step() refuses it
    with pytest.raises(ultra.InvalidArgument):
        ctx.step(batch)
    batch.clear()
    batch.add(1, 5, 0, ultra.Output.sample)  # does not continue the sequence
    with pytest.raises(ultra.InvalidArgument):
        ctx.step(batch)
    with pytest.raises(ultra.InvalidArgument):
        ctx.logits(0)  # no step ran
    with pytest.raises(ultra.InvalidArgument):
        ctx.crop(7, 0)  # no such sequence
    with pytest.raises(ultra.InvalidArgument):
        ctx.sampled(-1)
    with pytest.raises(IndexError):
        batch.token(4)
    with pytest.raises(ultra.InvalidArgument):
        ultra.Batch(0)
    with pytest.raises(ultra.InvalidArgument):
        ultra.Batch(2).add_sequence([1, 2, 3], 0, 0)
    with pytest.raises(TypeError):
        batch.add(2**40, 0, 0)

    with pytest.raises(ultra.InvalidArgument, match="out of range"):
        llm.generate([[1, 2, model.n_vocab + 5]])
    with pytest.raises(ultra.InvalidArgument, match="empty"):
        llm.generate([[]])
    with pytest.raises(ultra.InvalidArgument, match="max_tokens"):
        llm.generate("ROMEO:", max_tokens=0)
    with pytest.raises(ultra.InvalidArgument, match="context"):
        llm.generate([[1] * N_CTX])
    with pytest.raises(TypeError):
        llm.generate("ROMEO:", temperature="hot")
    with pytest.raises(TypeError):
        llm.generate("ROMEO:", colour=1)
    with pytest.raises(TypeError):
        llm.generate(3.5)
    with pytest.raises(ultra.InvalidArgument, match="role"):
        llm.chat([{"content": "no role"}])
    with pytest.raises(ultra.InvalidArgument, match="non-empty"):
        llm.chat([])
    with pytest.raises(ultra.InvalidArgument, match="max_tokens"):
        llm.complete("ROMEO:", max_tokens=N_CTX)
    # Still usable after all of the above.
    assert llm.generate("ROMEO:", temperature=0, max_tokens=4)[0].finish_reason == "length"


def test_keyboard_interrupt_ends_generation_within_one_step(llm):
    reference = llm.generate(["ROMEO:", "JULIET:"], temperature=0, max_tokens=8)
    steps_before = llm.ctx.stats["n_steps"]
    sent = []

    def interrupt():
        time.sleep(0.2)
        sent.append((time.perf_counter(), llm.ctx.stats["n_steps"]))
        _thread.interrupt_main()

    threading.Thread(target=interrupt).start()
    with pytest.raises(KeyboardInterrupt):
        llm.generate(["ROMEO:", "JULIET:", "HAMLET:"], temperature=0, max_tokens=N_CTX - 8, ignore_eos=True)
    t_sent, steps_at_signal = sent[0]
    assert time.perf_counter() - t_sent < 0.5
    assert llm.ctx.stats["n_steps"] - steps_at_signal <= 2  # the step in flight, then the loop stops
    assert llm.ctx.stats["n_steps"] - steps_before < N_CTX - 16  # it did not run to the end
    # The context is usable and gives the same answers as before.
    again = llm.generate(["ROMEO:", "JULIET:"], temperature=0, max_tokens=8)
    assert [o.token_ids for o in again] == [o.token_ids for o in reference]


def test_interrupt_during_a_stream_leaves_the_llm_usable(llm):
    stream = llm.complete("ROMEO:", temperature=0, max_tokens=64, stream=True)
    next(stream)
    with pytest.raises(ultra.Error, match="already generating"):
        llm.generate("JULIET:")
    stream.close()  # an abandoned stream frees its slot
    assert llm.generate("JULIET:", temperature=0, max_tokens=4)[0].finish_reason == "length"
    with pytest.raises(TypeError):  # checked at the call, not at the first chunk
        llm.complete("ROMEO:", stream=True, temperature="hot")
    reference = llm.complete("ROMEO:", temperature=0, max_tokens=16)["choices"][0]["text"]
    with pytest.raises(KeyboardInterrupt):
        for i, _ in enumerate(llm.complete("ROMEO:", temperature=0, max_tokens=N_CTX - 8, ignore_eos=True,
                                           stream=True)):
            if i == 3:
                _thread.interrupt_main()
    text = "".join(c["choices"][0]["text"] for c in llm.complete("ROMEO:", temperature=0, max_tokens=16, stream=True))
    assert text == reference


def test_low_level_snapshot_restore_and_stream(model):
    ctx = ultra.Context(model, n_ctx=64, n_slots=2)
    ctx.set_sampling(1, ultra.SamplingParams(seed=5))
    ids = model.tokenizer.encode("ROMEO:")
    batch = ultra.Batch(16)
    batch.add_sequence(ids, 0, 1, ultra.Output.sample)
    ctx.step(batch)
    snap = ctx.snapshot(1)
    first = ctx.sampled(len(batch) - 1)
    batch.clear()
    batch.add(first, len(ids), 1, ultra.Output.sample)
    ctx.step(batch)
    second = ctx.sampled(0)
    assert ctx.seq_tokens(1) == ids + [first]
    ctx.restore(1, snap)
    assert ctx.seq_len(1) == len(ids)
    ctx.step(batch)  # the same row again: the same seeded token
    assert ctx.sampled(0) == second
    ts = ultra.TextStream(model.tokenizer)
    text = "".join(ts.push(t) for t in [first, second]) + ts.flush()
    assert text == model.tokenizer.decode([first, second])
    stops = ultra.StopStrings(["END"])
    assert stops.push("abcE") == "abc" and stops.push("ND tail") == "" and stops.stopped


def test_text_held_back_for_a_stop_string_comes_out_at_the_end(llm):
    plain = llm.generate("ROMEO:", temperature=0, max_tokens=12)[0]
    stop = [plain.text[-1] + "\x01never"]  # the text's last character could begin it: held back, then flushed
    held = llm.generate("ROMEO:", temperature=0, max_tokens=12, stop=stop)[0]
    assert held.text == plain.text and held.finish_reason == "length"
    chunks = list(llm.complete("ROMEO:", temperature=0, max_tokens=12, stop=stop, stream=True))
    assert "".join(c["choices"][0]["text"] for c in chunks) == plain.text
    cut = llm.generate("ROMEO:", temperature=0, max_tokens=12, stop=[plain.text[3:6]])[0]
    assert cut.text == plain.text[:3] and cut.finish_reason == "stop"


def test_python_m_ultra_runs_the_command(llm):
    import os
    import sys
    out = subprocess.run([sys.executable, "-m", "ultra", "run", "-m", str(TARGET), "-p", "ROMEO:", "-n", "8",
                          "--temp", "0", "-c", str(N_CTX)], capture_output=True, text=True, check=True,
                         env=dict(os.environ, ULTRA_BIN=ultra_bin()))
    assert out.stdout.rstrip("\n") == "ROMEO:" + llm.generate("ROMEO:", temperature=0, max_tokens=8)[0].text


def f32(x):
    return np.float32(x)  # the server prints each float32 in its shortest form


def same_logprobs(mine, theirs):
    if isinstance(mine, dict):
        assert set(mine) == set(theirs)
        for k in mine:
            same_logprobs(mine[k], theirs[k])
    elif isinstance(mine, list):
        assert len(mine) == len(theirs)
        for a, b in zip(mine, theirs):
            same_logprobs(a, b)
    elif isinstance(mine, float):
        assert f32(mine) == f32(theirs)
    else:
        assert mine == theirs


def test_logprobs_equal_the_servers_and_stream_alike(llm, server):
    body = {"prompt": "ROMEO:", "temperature": 0, "max_tokens": 12, "logprobs": 3, "stop": ["thee"]}
    theirs = post(server + "/v1/completions", body)["choices"][0]
    mine = llm.complete("ROMEO:", temperature=0, max_tokens=12, logprobs=3, stop=["thee"])["choices"][0]
    assert mine["text"] == theirs["text"]
    same_logprobs(mine["logprobs"], theirs["logprobs"])
    chunks = list(llm.complete("ROMEO:", temperature=0, max_tokens=12, logprobs=3, stop=["thee"], stream=True))
    streamed = [c["choices"][0]["logprobs"] for c in chunks if c["choices"][0]["logprobs"]]
    assert sum((s["tokens"] for s in streamed), []) == mine["logprobs"]["tokens"]

    body = {"messages": MESSAGES, "temperature": 0.7, "seed": 9, "max_tokens": 10, "logprobs": True,
            "top_logprobs": 2}
    theirs = post(server + "/v1/chat/completions", body)["choices"][0]
    mine = llm.chat(MESSAGES, temperature=0.7, seed=9, max_tokens=10, logprobs=True, top_logprobs=2)["choices"][0]
    assert mine["message"] == theirs["message"]
    same_logprobs(mine["logprobs"], theirs["logprobs"])
    with pytest.raises(ultra.InvalidArgument):
        llm.chat(MESSAGES, top_logprobs=2)
    with pytest.raises(ultra.InvalidArgument):
        llm.complete("ROMEO:", logprobs=21)


def test_a_step_releases_the_gil(model):
    ctx = ultra.Context(model, n_ctx=256, threads=1)
    batch = ultra.Batch(256)
    batch.add_sequence(list(range(1, 201)), 0, 0, ultra.Output.sample)  # a long prefill step
    seen = []  # when another Python thread ran
    done = threading.Event()

    def spin():
        while not done.is_set():
            seen.append(time.perf_counter())
            time.sleep(0.001)

    t = threading.Thread(target=spin)
    t.start()
    spans = []
    for _ in range(3):
        t0 = time.perf_counter()
        ctx.step(batch)
        spans.append((t0, time.perf_counter()))
        ctx.clear(0)
    done.set()
    t.join()
    # With the GIL held through the step, the other thread could run only just before the call (after t0,
    # at most once); released, it wakes every millisecond of the step.
    inside = [sum(1 for x in seen if t0 < x < t1) for t0, t1 in spans]
    assert max(inside) >= 5, (inside, [t1 - t0 for t0, t1 in spans])
