"""The high-level API: ultra.LLM (vLLM's offline ``LLM.generate``, llama-cpp-python's completions).

One LLM holds a model and one Context of ``n_slots`` sequences. ``generate`` runs many prompts together by
continuous batching: every step carries one decode row for each generating slot plus prefill rows of the
prompts being read, and a slot that finishes takes the next waiting prompt at once. A sequence's tokens do
not depend on which slot or step it ran in (the CPU kernels compute each row alone, and the sampler's random
numbers are keyed by (seed, position)), so ``generate`` over many prompts equals one call per prompt.

Stopping is the server's (``ultra serve``): an end-of-generation token ("stop", its text not output), a
stop string ("stop", text held back so that no part of it is returned), ``max_tokens`` or a full context
("length"). A KeyboardInterrupt (Ctrl-C) ends generation after the step in flight: the slots it used are
cleared, the context stays usable, and the exception reaches the caller.
"""

from __future__ import annotations

import json
import numbers
import os
import queue
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

from . import _core
from ._core import Batch, ChatFormatter, Context, InvalidArgument, Model, Output, SamplingParams, StopStrings, TextStream

Prompt = Union[str, Sequence[int]]

# Keyword arguments that set SamplingParams fields (OpenAI / llama.cpp names; repetition_penalty is vLLM's).
_SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n",
                    "presence_penalty", "frequency_penalty", "seed", "n_probs")
_ALIASES = {"repetition_penalty": "repeat_penalty"}


@dataclass
class GenerationOutput:
    """One prompt's result from LLM.generate.

    finish_reason: "stop" (an end-of-generation token or a stop string) or "length" (max_tokens, or the
    context is full). token_ids: every generated token, an end-of-generation token included; text: their
    text up to any stop string. timings (milliseconds, wall clock): queued_ms (waiting for a slot),
    prompt_ms (admission to first token), decode_ms (first token to the last), n_prompt, n_generated,
    tokens_per_s (decode rate after the first token).
    """

    index: int
    prompt: Optional[str]
    prompt_token_ids: List[int]
    text: str
    token_ids: List[int]
    finish_reason: str
    timings: Dict[str, float] = field(default_factory=dict)
    # With logprobs=N: per generated token (end-of-generation tokens and tokens past a stop string left out,
    # as the server does) {"token": id, "logprob": float, "top": [(id, logprob)] (N best), "offset": the
    # byte offset of its text in `text`}.
    logprobs: Optional[List[Dict[str, Any]]] = None


class _Request:
    __slots__ = ("index", "prompt", "ids", "sp", "max_tokens", "stops", "stream", "ignore_eos", "slot", "fed",
                 "last", "generated", "text", "finish", "t_submit", "t_admit", "t_first", "t_end", "tokenizer",
                 "lp", "n_top", "n_piece_bytes")

    def __init__(self, index, prompt, ids, sp, max_tokens, stop, ignore_eos, tokenizer, logprobs=None):
        self.index = index
        self.prompt = prompt
        self.ids = ids
        self.sp = sp
        self.max_tokens = max_tokens
        self.stops = StopStrings(list(stop))
        self.stream = TextStream(tokenizer) if tokenizer is not None else None
        self.ignore_eos = ignore_eos
        self.slot = -1
        self.fed = 0  # prompt tokens in the cache
        self.last = -1  # the last sampled token (the next decode row's token)
        self.generated: List[int] = []
        self.text: List[str] = []
        self.finish: Optional[str] = None
        self.t_submit = time.perf_counter()
        self.t_admit = self.t_first = self.t_end = 0.0
        self.tokenizer = tokenizer
        self.lp: Optional[List[Dict[str, Any]]] = None if logprobs is None else []
        self.n_top = logprobs or 0
        self.n_piece_bytes = 0  # bytes of the text of the tokens recorded so far

    def record(self, tok: int, ctx: Context, row: int, model: Model) -> None:
        """Keeps the token's log-probabilities (logprobs requested), as the server's scheduler does."""
        if self.lp is None or (not self.ignore_eos and model.is_eog(tok)):
            return
        self.lp.append({"token": tok, "logprob": ctx.logprob(row), "top": ctx.top_logprobs(row)[:self.n_top],
                        "offset": self.n_piece_bytes})
        if self.tokenizer is not None and not self.tokenizer.is_special(tok):
            self.n_piece_bytes += len(self.tokenizer.token_to_piece(tok))

    def released_logprobs(self, n_emitted: int, done: bool) -> int:
        """How many recorded entries belong to text handed out (n_emitted bytes), as the server releases them:
        every one once the request is done, unless a stop string cut the text."""
        if done and not self.stops.stopped:
            return len(self.lp or [])
        return sum(1 for e in self.lp or [] if e["offset"] < n_emitted)

    def accept(self, tok: int, now: float, model: Model, n_ctx: int) -> str:
        """Takes a generated token as the server's scheduler does; returns the text that became final and
        sets finish when the request is done."""
        self.generated.append(tok)
        self.t_end = now
        piece = ""
        if not self.ignore_eos and model.is_eog(tok):
            self.finish = "stop"
        else:
            if self.stream is not None:
                piece = self.stops.push(self.stream.push(tok))
                if self.stops.stopped:
                    self.finish = "stop"
            if self.finish is None and (len(self.generated) >= self.max_tokens or
                                        len(self.ids) + len(self.generated) - 1 >= n_ctx):
                self.finish = "length"
            self.last = tok
        if self.finish is not None and self.stream is not None and not self.stops.stopped:
            tail = self.stops.push(self.stream.flush())  # a stop string may complete in the tail
            if self.stops.stopped:
                self.finish = "stop"
            else:
                tail += self.stops.flush()
            piece += tail
        if piece:
            self.text.append(piece)
        return piece

    def output(self) -> GenerationOutput:
        n = len(self.generated)
        decode_ms = (self.t_end - self.t_first) * 1e3
        return GenerationOutput(
            index=self.index, prompt=self.prompt if isinstance(self.prompt, str) else None,
            prompt_token_ids=list(self.ids), text="".join(self.text), token_ids=self.generated,
            finish_reason=self.finish or "length",
            logprobs=None if self.lp is None else
            self.lp[:self.released_logprobs(len("".join(self.text).encode()), True)],
            timings={"queued_ms": (self.t_admit - self.t_submit) * 1e3,
                     "prompt_ms": (self.t_first - self.t_admit) * 1e3, "decode_ms": decode_ms,
                     "n_prompt": len(self.ids), "n_generated": n,
                     "tokens_per_s": (n - 1) * 1e3 / decode_ms if n > 1 and decode_ms > 0 else 0.0})


def sampling_params(sampling: Union[SamplingParams, Dict[str, Any], None] = None, **fields) -> SamplingParams:
    """A SamplingParams from another one, a dict and/or keyword fields (OpenAI names accepted:
    repetition_penalty). Unknown names raise TypeError; values out of range raise ultra.InvalidArgument."""
    base: Dict[str, Any] = {}
    if isinstance(sampling, SamplingParams):
        base = {k: getattr(sampling, k) for k in _SAMPLING_FIELDS}
    elif isinstance(sampling, dict):
        base = dict(sampling)
    elif sampling is not None:
        raise TypeError(f"sampling must be an ultra.SamplingParams or a dict, not {type(sampling).__name__}")
    base.update(fields)
    out = {}
    for k, v in base.items():
        k = _ALIASES.get(k, k)
        if k not in _SAMPLING_FIELDS:
            raise TypeError(f"unknown sampling field {k!r} (known: {', '.join(_SAMPLING_FIELDS)})")
        if v is not None:
            out[k] = v
    if out.get("seed", 0) < 0:
        raise InvalidArgument(f"seed must be >= 0, not {out['seed']}")
    return SamplingParams(**out)


def _one_prompt(p) -> bool:
    """A single prompt (text, a list of ids or a 1-D array of ids) rather than a list of prompts."""
    return (isinstance(p, str) or getattr(p, "ndim", 0) == 1 or
            (isinstance(p, (list, tuple)) and len(p) > 0 and isinstance(p[0], numbers.Integral)))


def _load(model, mmap: bool) -> Model:
    if isinstance(model, Model):
        return model
    if isinstance(model, (str, os.PathLike)):
        return Model(os.fspath(model), mmap=mmap)
    raise TypeError(f"model must be a path or an ultra.Model, not {type(model).__name__}")


class LLM:
    """A model and a context of n_slots sequences, driven from Python.

    LLM(model, n_ctx=0, n_slots=4, device="cpu", threads=0, n_batch=512, kv_type="", mmap=True)
      model: a path (GGUF file or HF directory) or an ultra.Model; n_ctx: tokens per sequence (0: the
      model's training context, at most 4096); n_slots: prompts generated at once; device: "cpu" or "cuda";
      threads: CPU threads (0: all).
      Speculative decoding (draft_model: a path or Model with the same vocabulary; lookup: prompt-lookup
      n-gram length, 0 off; n_draft: most tokens drafted per round; draft_p_min: adaptive draft length):
      prompts then run one at a time through the C++ speculative loop, with the target's output
      distribution (greedy: exactly the plain greedy tokens).
    """

    def __init__(self, model: Union[str, os.PathLike, Model], n_ctx: int = 0, n_slots: int = 4,
                 device: str = "cpu", threads: int = 0, n_batch: int = 512, kv_type: str = "",
                 mmap: bool = True, draft_model: Union[str, os.PathLike, Model, None] = None, lookup: int = 0,
                 n_draft: int = 8, draft_p_min: float = 0.0):
        self.model = _load(model, mmap)
        self._speculative = draft_model is not None or lookup > 0
        if lookup < 0 or n_draft < 1:
            raise InvalidArgument(f"lookup must be >= 0 and n_draft >= 1 (got {lookup}, {n_draft})")
        self._lookup, self._n_draft, self._draft_p_min = lookup, n_draft, draft_p_min
        rows = n_draft + 1 if self._speculative else 0  # a verification step: K + 1 rows, all outputs
        self.ctx = Context(self.model, n_ctx=n_ctx, n_slots=n_slots, n_batch=max(n_batch, rows),
                           n_outputs=max(n_slots, rows), threads=threads, device=device, kv_type=kv_type)
        self.draft = None
        self._draft_ctx = None
        if draft_model is not None:
            self.draft = _load(draft_model, mmap)
            _core.check_draft_compatible(self.model, self.draft)
            self._draft_ctx = Context(self.draft, n_ctx=self.ctx.n_ctx, n_slots=1, n_outputs=1, threads=threads,
                                      device=device, kv_type=kv_type)
        self.tokenizer = self.model.tokenizer
        self.n_ctx = self.ctx.n_ctx
        self.n_slots = self.ctx.n_slots
        self._batch = Batch(self.ctx.n_batch)
        self._chat: Optional[ChatFormatter] = None
        self._busy = False
        self.name = os.path.basename(self.model.info.path)

    # ---- tokens ----------------------------------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> List[int]:
        """Token ids of text, as `ultra run -p` and the server's completions encode a prompt."""
        return self._tok().encode(text, add_special, parse_special)

    def detokenize(self, ids: Sequence[int], skip_special: bool = False) -> str:
        return self._tok().decode(list(ids), skip_special)

    def _tok(self):
        if self.tokenizer is None:
            raise InvalidArgument(f"{self.model.info.path}: this model has no tokenizer; give token ids")
        return self.tokenizer

    def _prompt_ids(self, prompt: Prompt) -> List[int]:
        if isinstance(prompt, str):
            ids = self.tokenize(prompt)
        elif isinstance(prompt, (list, tuple)) or getattr(prompt, "ndim", 0) == 1:
            if not all(isinstance(t, numbers.Integral) for t in prompt):
                raise TypeError("a prompt of token ids holds ints")
            ids = [int(t) for t in prompt]
        else:
            raise TypeError(f"a prompt is a str or a list of token ids, not {type(prompt).__name__}")
        if not ids:
            raise InvalidArgument("the prompt is empty (no tokens)")
        limit = self.tokenizer.n_vocab if self.tokenizer is not None else self.model.n_vocab
        for t in ids:
            if t < 0 or t >= limit:
                raise InvalidArgument(f"prompt token id {t} is out of range (the vocabulary has {limit} tokens)")
        if len(ids) >= self.n_ctx:
            raise InvalidArgument(f"the prompt has {len(ids)} tokens, which leaves no room in the context of "
                                  f"{self.n_ctx} tokens")
        return ids

    # ---- generation ------------------------------------------------------------------------------------

    def generate(self, prompts: Union[Prompt, Sequence[Prompt]],
                 sampling: Union[SamplingParams, Dict[str, Any], Sequence[SamplingParams], None] = None, *,
                 max_tokens: int = 16, stop: Union[str, Sequence[str], None] = None, ignore_eos: bool = False,
                 logprobs: Optional[int] = None, **fields) -> List[GenerationOutput]:
        """Generates for every prompt (a str or token ids), n_slots at a time by continuous batching.

        sampling: one SamplingParams (or dict) for all, or one per prompt; keyword fields (temperature=...,
        seed=...) override it. Default: SamplingParams() (llama.cpp's defaults, seed 0xdeadbeef).
        logprobs: N in [0, 20] keeps each token's log-probability and the N best alternatives.
        Returns one GenerationOutput per prompt, in order.
        """
        outs: List[Optional[GenerationOutput]] = []
        reqs = self._requests(prompts, sampling, max_tokens, stop, ignore_eos, fields, logprobs)
        for req, _, _ in self._events(reqs, per_token=False):
            if len(outs) <= req.index:
                outs.extend([None] * (req.index + 1 - len(outs)))
            outs[req.index] = req.output()
        return outs  # type: ignore[return-value]

    def _requests(self, prompts, sampling, max_tokens, stop, ignore_eos, fields, logprobs) -> List[_Request]:
        if _one_prompt(prompts):
            prompts = [prompts]
        prompts = list(prompts)
        if isinstance(sampling, (list, tuple)):
            if len(sampling) != len(prompts):
                raise InvalidArgument(f"{len(sampling)} sampling settings for {len(prompts)} prompts")
            sps = [sampling_params(s, **fields) for s in sampling]
        else:
            sp = sampling_params(sampling, **fields)
            sps = [sp] * len(prompts)
        if logprobs is not None:
            if not isinstance(logprobs, int) or isinstance(logprobs, bool):
                raise TypeError(f"logprobs must be an int, not {type(logprobs).__name__}")
            if not 0 <= logprobs <= SamplingParams.MAX_PROBS:
                raise InvalidArgument(f"logprobs must be in [0, {SamplingParams.MAX_PROBS}], not {logprobs}")
            if self._speculative:
                raise InvalidArgument("logprobs are not available with speculative decoding (tokens come in rounds)")
            # >= 1: a greedy row computes its log-probability only then.
            sps = [sampling_params(sp, n_probs=max(1, logprobs)) for sp in sps]
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
            raise TypeError(f"max_tokens must be an int, not {type(max_tokens).__name__}")
        if max_tokens < 1:
            raise InvalidArgument(f"max_tokens must be >= 1, not {max_tokens}")
        if stop is None:
            stops: List[str] = []
        elif isinstance(stop, str):
            stops = [stop]
        else:
            stops = list(stop)
            if not all(isinstance(s, str) for s in stops):
                raise TypeError("stop must be a str or a list of str")
        return [_Request(i, p, self._prompt_ids(p), sps[i], max_tokens, stops, bool(ignore_eos), self.tokenizer,
                         logprobs) for i, p in enumerate(prompts)]

    def _events(self, reqs: List[_Request], per_token: bool) -> Iterator[tuple]:
        """Runs the requests; yields (request, token, text) per generated token when per_token, and
        (request, None, None) when a request finishes."""
        if self._busy:
            raise _core.Error("this LLM is already generating (one generation at a time; finish or close "
                              "the other stream first)")
        self._busy = True
        try:
            if self._speculative:
                yield from self._speculative_events(reqs, per_token)
            else:
                yield from self._batched_events(reqs, per_token)
        finally:
            self._busy = False

    def _batched_events(self, reqs: List[_Request], per_token: bool) -> Iterator[tuple]:
        """Continuous batching over the slots (see the module's docstring)."""
        ctx, batch, model = self.ctx, self._batch, self.model
        n_ctx, n_batch = self.n_ctx, batch.capacity
        waiting = deque(reqs)
        active: Dict[int, _Request] = {}
        free = list(range(self.n_slots - 1, -1, -1))
        SAMPLE, NONE = Output.sample, Output.none
        try:
            while waiting or active:
                while free and waiting:  # a free slot takes the next prompt
                    r = waiting.popleft()
                    r.slot = free.pop()
                    ctx.clear(r.slot)
                    ctx.set_sampling(r.slot, r.sp)
                    r.t_admit = time.perf_counter()
                    active[r.slot] = r
                batch.clear()
                rows = []
                room = n_batch
                for r in active.values():  # one decode row per generating slot
                    if r.fed == len(r.ids):
                        rows.append((batch.add(r.last, len(r.ids) + len(r.generated) - 1, r.slot, SAMPLE), r))
                        room -= 1
                for r in active.values():  # then prompt rows, as many as fit
                    if r.fed < len(r.ids) and room > 0:
                        n = min(room, len(r.ids) - r.fed)
                        done = r.fed + n == len(r.ids)
                        batch.add_sequence(r.ids[r.fed:r.fed + n], r.fed, r.slot, SAMPLE if done else NONE)
                        if done:
                            rows.append((len(batch) - 1, r))
                        r.fed += n
                        room -= n
                ctx.step(batch)
                now = time.perf_counter()
                for row, r in rows:
                    tok = ctx.sampled(row)
                    if not r.generated:
                        r.t_first = now
                    if r.lp is not None:
                        r.record(tok, ctx, row, model)
                    piece = r.accept(tok, now, model, n_ctx)
                    if per_token:
                        yield r, tok, piece
                    if r.finish is not None:
                        del active[r.slot]
                        free.append(r.slot)
                        yield r, None, None
        finally:
            for slot in active:  # interrupted or abandoned: the context stays usable
                ctx.clear(slot)

    def _speculative_events(self, reqs: List[_Request], per_token: bool) -> Iterator[tuple]:
        """One prompt at a time through the C++ speculative loop (generate_speculative: the draft model
        and/or prompt lookup), run on a worker thread so that its tokens can be yielded as the rounds give
        them. An interrupt or an abandoned stream stops it at its next token."""
        ctx, model, n_ctx = self.ctx, self.model, self.n_ctx
        for r in reqs:
            ctx.clear(0)
            ctx.set_sampling(0, r.sp)
            r.slot = 0
            r.t_admit = time.perf_counter()
            q: "queue.SimpleQueue[tuple]" = queue.SimpleQueue()
            cancel = threading.Event()

            def on_token(tok, r=r, q=q, cancel=cancel):
                if cancel.is_set():
                    return False
                now = time.perf_counter()
                if not r.generated:
                    r.t_first = now
                q.put((tok, r.accept(tok, now, model, n_ctx)))
                return r.finish is None

            def run(r=r, q=q, on_token=on_token):
                try:
                    _core.generate_speculative(ctx, self._draft_ctx, r.ids, seq=0, n_predict=r.max_tokens,
                                               ignore_eos=r.ignore_eos, n_draft=self._n_draft,
                                               p_min=self._draft_p_min, lookup=self._lookup, on_token=on_token)
                    q.put(("done", None))
                except BaseException as e:  # handed to the caller's thread
                    q.put(("error", e))

            worker = threading.Thread(target=run, name="ultra-speculative", daemon=True)
            worker.start()
            try:
                while True:
                    tok, piece = q.get()
                    if tok == "done":
                        break
                    if tok == "error":
                        raise piece
                    if per_token:
                        yield r, tok, piece
                if r.finish is None:
                    r.finish = "length"
                yield r, None, None
            finally:
                cancel.set()
                worker.join()
                ctx.clear(0)

    # ---- OpenAI-shaped completions -----------------------------------------------------------------------

    def complete(self, prompt: Prompt, *, max_tokens: Optional[int] = None,
                 stop: Union[str, Sequence[str], None] = None, ignore_eos: bool = False, stream: bool = False,
                 logprobs: Optional[int] = None, **sampling) -> Union[Dict[str, Any], Iterator[Dict[str, Any]]]:
        """A text completion as the server's /v1/completions answers it ({"id", "object": "text_completion",
        "created", "model", "choices": [{"index", "text", "logprobs", "finish_reason"}], "usage"}); with
        stream=True a generator of the server's chunks, the last one carrying finish_reason.
        max_tokens: default the room left in the context (as the server). logprobs: N alternatives per token
        ({"tokens", "token_logprobs", "top_logprobs", "text_offset"}). Sampling fields as keywords
        (temperature, top_k, top_p, min_p, repeat_penalty / repetition_penalty, repeat_last_n,
        presence_penalty, frequency_penalty, seed)."""
        return self._openai(prompt, False, max_tokens, stop, ignore_eos, stream, logprobs, sampling)

    def chat(self, messages: Sequence[Dict[str, Any]], *, max_tokens: Optional[int] = None,
             stop: Union[str, Sequence[str], None] = None, ignore_eos: bool = False, stream: bool = False,
             logprobs: bool = False, top_logprobs: int = 0, chat_template_kwargs: Optional[Dict[str, Any]] = None,
             **sampling) -> Union[Dict[str, Any], Iterator[Dict[str, Any]]]:
        """A chat completion as the server's /v1/chat/completions answers it (the prompt rendered and
        tokenized by the same code, ultra.ChatFormatter); stream=True: "chat.completion.chunk" chunks.
        logprobs / top_logprobs: OpenAI's chat log-probabilities ({"content": [{token, logprob, bytes,
        top_logprobs}]})."""
        if top_logprobs and not logprobs:
            raise InvalidArgument("'top_logprobs' needs 'logprobs': True")
        ids = self.chat_prompt_ids(messages, chat_template_kwargs=chat_template_kwargs)
        return self._openai(ids, True, max_tokens, stop, ignore_eos, stream, top_logprobs if logprobs else None,
                            sampling)

    def chat_prompt(self, messages: Sequence[Dict[str, Any]], add_generation_prompt: bool = True,
                    chat_template_kwargs: Optional[Dict[str, Any]] = None) -> str:
        """The prompt text the server renders for these messages."""
        return self._formatter().render(self._messages_json(messages), add_generation_prompt,
                                        json.dumps(chat_template_kwargs or {}))

    def chat_prompt_ids(self, messages: Sequence[Dict[str, Any]], add_generation_prompt: bool = True,
                        chat_template_kwargs: Optional[Dict[str, Any]] = None) -> List[int]:
        """The prompt's token ids as the server computes them for these messages."""
        return self._formatter().encode(self._messages_json(messages), add_generation_prompt, False,
                                        json.dumps(chat_template_kwargs or {}))

    def _formatter(self) -> ChatFormatter:
        if self._chat is None:
            self._chat = ChatFormatter(self.model)
        return self._chat

    @staticmethod
    def _messages_json(messages) -> str:
        if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
            raise TypeError("messages must be a list of {'role': ..., 'content': ...} dicts")
        try:
            return json.dumps(list(messages), ensure_ascii=False)
        except TypeError as e:
            raise TypeError(f"messages must be JSON-serializable: {e}") from None

    def _logprobs_json(self, chat: bool, entries: List[Dict[str, Any]]) -> Dict[str, Any]:
        """The server's logprobs object of a choice (server.cpp's logprobs_json)."""
        tok = self._tok()

        def text(i):
            return tok.token_to_piece(i).decode("utf-8", "replace")

        if chat:
            return {"content": [{"token": text(e["token"]), "logprob": e["logprob"],
                                 "bytes": list(tok.token_to_piece(e["token"])),
                                 "top_logprobs": [{"token": text(t), "logprob": lp, "bytes": list(tok.token_to_piece(t))}
                                                  for t, lp in e["top"]]} for e in entries]}
        return {"tokens": [text(e["token"]) for e in entries], "token_logprobs": [e["logprob"] for e in entries],
                "top_logprobs": [{text(t): lp for t, lp in e["top"]} for e in entries],
                "text_offset": [e["offset"] for e in entries]}

    def _openai(self, prompt, chat, max_tokens, stop, ignore_eos, stream, logprobs, sampling):
        ids = self._prompt_ids(prompt)
        if max_tokens is None:
            max_tokens = self.n_ctx - len(ids)
        elif isinstance(max_tokens, int) and len(ids) + max_tokens > self.n_ctx:
            raise InvalidArgument(f"the prompt ({len(ids)} tokens) plus max_tokens ({max_tokens}) is over the "
                                  f"context of {self.n_ctx} tokens")
        head = {"id": ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24],
                "object": "chat.completion.chunk" if stream and chat else
                "chat.completion" if chat else "text_completion",
                "created": int(time.time()), "model": self.name}
        if "seed" not in sampling or sampling["seed"] is None:  # the server draws a seed per request
            sampling["seed"] = int.from_bytes(os.urandom(8), "little")
        if stream:  # the arguments are checked now, not at the first chunk
            return self._stream(head, chat, self._requests([ids], None, max_tokens, stop, ignore_eos, sampling,
                                                           logprobs))
        out = self.generate([ids], max_tokens=max_tokens, stop=stop, ignore_eos=ignore_eos, logprobs=logprobs,
                            **sampling)[0]
        choice: Dict[str, Any] = {"index": 0, "finish_reason": out.finish_reason,
                                  "logprobs": None if out.logprobs is None else self._logprobs_json(chat, out.logprobs)}
        if chat:
            choice["message"] = {"role": "assistant", "content": out.text}
        else:
            choice["text"] = out.text
        n = len(out.token_ids)
        return dict(head, choices=[choice], timings=out.timings,
                    usage={"prompt_tokens": len(ids), "completion_tokens": n, "total_tokens": len(ids) + n})

    def _stream(self, head, chat, reqs: List[_Request]) -> Iterator[Dict[str, Any]]:
        def chunk(text, finish, first=False, lp=None):
            c: Dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": lp}
            if chat:
                delta: Dict[str, Any] = {"role": "assistant"} if first else {}
                if text or first:
                    delta["content"] = text
                c["delta"] = delta
            else:
                c["text"] = text
            return dict(head, choices=[c])

        first = True
        emitted = released = 0  # bytes of text handed out; log-probability entries handed out
        for r, tok, piece in self._events(reqs, per_token=True):
            if tok is None:
                yield chunk("", r.finish or "length")
                continue
            emitted += len(piece.encode())
            lp = None
            if r.lp is not None:
                n = r.released_logprobs(emitted, r.finish is not None)
                lp = self._logprobs_json(chat, r.lp[released:n])
                if n == released and not piece and not (first and chat):
                    continue
                released = n
            elif not piece and not (first and chat):
                continue
            yield chunk(piece, None, first, lp)
            first = False

    def __repr__(self) -> str:
        return f"ultra.LLM({self.model.info.path!r}, n_ctx={self.n_ctx}, n_slots={self.n_slots}, " \
               f"device={self.ctx.device!r})"
