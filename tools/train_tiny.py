#!/usr/bin/env python3
"""Train a tiny byte-level BPE tokenizer and two tiny Llama models (a target and a draft) on a text file.

Run on a machine with one CUDA GPU, torch, transformers (5.x), tokenizers, safetensors; no network needed:

    PYTHONUNBUFFERED=1 python3 tools/train_tiny.py --data .data/tinyshakespeare.txt

About 1.5 minutes on one H200 with the defaults (40 epochs of the target, ~40 s; 30 of the draft, ~20 s; plus
start-up, tokenizer, evaluation, saving); at most ~8 minutes whatever the machine (the time budgets cap it).

What it does (every number goes into models/hf/train_report.json):
  1. Splits the text by characters: the first 90% is the training text, the last 10% the validation text.
     Trains a byte-level BPE tokenizer (HF `tokenizers`: ByteLevel pre-tokenizer with add_prefix_space=False
     and the GPT-2 regex, ByteLevel decoder, vocabulary 4096) on the training text only. One special token,
     "<|endoftext|>" = id 0, serves as BOS, EOS (and pad); it is never added automatically
     (add_bos_token = add_eos_token = false, GPT-2 style), so the token ids of a text are exactly its BPE
     tokens, in training, in validation and in ultra.
  2. Trains two LlamaForCausalLM models on the training tokens, with tied embeddings, context 256:
       target: hidden 384, 8 layers, 6 heads (head_dim 64), 2 KV heads, MLP 1024  (~14M parameters)
       draft:  hidden 128, 4 layers, 4 heads (head_dim 32), 2 KV heads, MLP 384   (~1.3M parameters)
     Batches of random 257-token windows of the training tokens; AdamW (betas 0.9/0.95, weight decay 0.1 on
     matrices), linear warm-up then cosine decay to lr/10; bf16 autocast, float32 master weights; residual
     dropout (on the attention and MLP outputs, via forward hooks: nothing in the saved model).
     Length: the corpus is small (~300k training tokens) and both models overfit it within a few dozen
     epochs (on an H200 in a 300 s budget the target would see ~300 epochs), so each run is planned as a
     number of epochs (--target-epochs 40, --draft-epochs 30: where a sweep of learning rate, dropout, weight
     decay, batch and length put the best validation loss at the end of the cosine schedule), cut down to
     what the time budget (--target-seconds, --draft-seconds) allows: after the first steps the step time is
     measured and the budget turned into a step count. The schedule is a plain function of the step; give
     --target-steps / --draft-steps to fix the counts and reproduce a run exactly (the report records the
     counts used and what limited them). The validation loss is evaluated 20 times per run; the checkpoint
     with the lowest one is kept (as nanoGPT does) and training stops early after --patience evaluations
     without improvement.
  3. Evaluates in float32 (no autocast, no TF32): the validation text is tokenized without BOS and cut into
     consecutive non-overlapping windows of 256 tokens (the tail shorter than a window is dropped); the
     validation loss is the mean NLL over every next-token prediction (positions 0..254 of each window),
     perplexity = exp(loss). Also the llama.cpp-style score (positions 128..254 of each window) and
     llama.cpp's error estimate ppl * sqrt((mean(nll^2) - mean(nll)^2) / (N - 1)) for both, so that
     `ultra perplexity --ids -f models/hf/val_ids.txt -c 256 [--all-positions]` can be compared with them.
     The draft's greedy agreement with the target: the fraction of those positions where both argmaxes agree.
     Greedy continuation (float32, no KV-cache subtleties: a full forward per token) of "ROMEO:" for 64
     tokens with each model.
  4. Saves each model in HF format (config.json, model.safetensors in float32, tokenizer.json,
     tokenizer_config.json) into --out-target / --out-draft, and the report, the validation token ids
     (val_ids.txt, space-separated) and the validation text (val.txt) next to the report.
Deterministic given the seed and the step counts (cuBLAS workspace config + deterministic algorithms where
PyTorch has them).
"""

import argparse
import hashlib
import copy
import json
import math
import os
import random
import sys
import time

# Must be set before CUDA is initialised (deterministic cuBLAS).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

T_START = time.time()


def log(*a):
    print(f"[{time.time() - T_START:7.1f}s]", *a, flush=True)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default="../shared/data/corpus/tinyshakespeare.txt", help="training text (UTF-8)")
    p.add_argument("--extra-data", action="append", default=[],
                   help="more training text (UTF-8; repeatable): used for training only, never for validation "
                        "or the tokenizer")
    p.add_argument("--extra-fraction", type=float, default=0.5,
                   help="with --extra-data: the fraction of each batch's windows drawn from the extra text")
    p.add_argument("--target-shape", default="384,8,6,2,1024", help="hidden,layers,heads,kv_heads,mlp")
    p.add_argument("--draft-shape", default="128,4,4,2,384", help="hidden,layers,heads,kv_heads,mlp")
    p.add_argument("--draft-distill", type=float, default=0.0,
                   help="> 0: the draft's loss is (1 - A) * cross-entropy + A * KL(target || draft) on the same "
                        "windows (the trained target as teacher), which raises its agreement with the target")
    p.add_argument("--target-distill", type=float, default=0.0,
                   help="> 0: born-again target: after the target is trained, a second one of the same shape is "
                        "trained with (1 - A) * cross-entropy + A * KL(first || second) and replaces it")
    p.add_argument("--draft-distill-alt", type=float, default=-1.0,
                   help=">= 0: also train a second draft with this distillation weight, saved to OUT_DRAFT_alt "
                        "and reported as draft_alt (to compare two drafts in one run)")
    p.add_argument("--out-target", default="models/hf/target")
    p.add_argument("--out-draft", default="models/hf/draft")
    p.add_argument("--report", default="models/hf/train_report.json")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--val-fraction", type=float, default=0.1)
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--ctx", type=int, default=256, help="training / evaluation window")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--target-seconds", type=float, default=300.0, help="time budget (an upper bound)")
    p.add_argument("--draft-seconds", type=float, default=120.0, help="time budget (an upper bound)")
    p.add_argument("--target-epochs", type=float, default=40.0,
                   help="passes over the training tokens, if the time budget allows (0: as many as it allows)")
    p.add_argument("--draft-epochs", type=float, default=30.0,
                   help="passes over the training tokens, if the time budget allows (0: as many as it allows)")
    p.add_argument("--target-steps", type=int, default=0,
                   help="> 0: fixed step count (ignores --target-seconds and --target-epochs)")
    p.add_argument("--draft-steps", type=int, default=0,
                   help="> 0: fixed step count (ignores --draft-seconds and --draft-epochs)")
    p.add_argument("--target-lr", type=float, default=5e-4)
    p.add_argument("--draft-lr", type=float, default=2e-3)
    p.add_argument("--target-dropout", type=float, default=0.2)
    p.add_argument("--draft-dropout", type=float, default=0.1)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--warmup", type=int, default=100, help="linear warm-up steps")
    p.add_argument("--n-evals", type=int, default=20, help="validation evaluations per run")
    p.add_argument("--patience", type=int, default=5,
                   help="stop after this many evaluations without a better validation loss (0: never)")
    p.add_argument("--prompt", default="ROMEO:")
    p.add_argument("--n-generate", type=int, default=64)
    return p.parse_args()


args = parse_args()

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import tokenizers  # noqa: E402
import transformers  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

SPECIAL = "<|endoftext|>"


def seed_all(seed):
    random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)


# ---------------------------------------------------------------------------------------------------- data


def load_text(path):
    with open(path, "rb") as f:
        raw = f.read()
    text = raw.decode("utf-8")
    return text, hashlib.sha256(raw).hexdigest()


def train_tokenizer(train_text, vocab_size):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[SPECIAL],  # first: id 0
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = train_text.splitlines(keepends=True)

    def chunks():  # pieces of 200 lines: the same words as the whole text, minus a few line boundaries
        for i in range(0, len(lines), 200):
            yield "".join(lines[i:i + 200])

    tok.train_from_iterator(chunks(), trainer=trainer, length=(len(lines) + 199) // 200)
    assert tok.token_to_id(SPECIAL) == 0, tok.token_to_id(SPECIAL)
    return tok


def encode(tok, text):
    return tok.encode(text, add_special_tokens=False).ids


def save_tokenizer(tok, out_dir, ctx):
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": SPECIAL,
        "eos_token": SPECIAL,
        "pad_token": SPECIAL,
        "add_bos_token": False,
        "add_eos_token": False,
        "model_max_length": ctx,
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": {
            "0": {"content": SPECIAL, "lstrip": False, "normalized": False, "rstrip": False,
                  "single_word": False, "special": True}
        },
        # The play-script chat template (`ultra convert` writes it as GGUF tokenizer.chat_template).
        "chat_template": open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models",
                                           "chat_template.jinja"), encoding="utf-8").read(),
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


# -------------------------------------------------------------------------------------------------- models


def make_config(vocab, hidden, layers, heads, kv_heads, ffn, ctx):
    return LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=ffn,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=hidden // heads,
        hidden_act="silu",
        max_position_embeddings=ctx,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True,
        attention_bias=False,
        attention_dropout=0.0,
        mlp_bias=False,
        initializer_range=0.02,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
        use_cache=True,
    )


def count_params(model):
    n = sum(p.numel() for p in model.parameters())  # tied weights counted once
    emb = model.get_input_embeddings().weight.numel()
    return n, n - emb


def add_residual_dropout(model, p):
    """Dropout on each attention and MLP output before it joins the residual stream (GPT-2 style), active only
    in train mode. Hooks, so the saved model is a plain LlamaForCausalLM."""
    if p <= 0:
        return []
    handles = []

    def attn_hook(mod, inp, out):
        if isinstance(out, tuple):
            return (F.dropout(out[0], p, mod.training),) + tuple(out[1:])
        return F.dropout(out, p, mod.training)

    def mlp_hook(mod, inp, out):
        return F.dropout(out, p, mod.training)

    for layer in model.model.layers:
        handles.append(layer.self_attn.register_forward_hook(attn_hook))
        handles.append(layer.mlp.register_forward_hook(mlp_hook))
    return handles


def lr_at(step, total, warmup, lr):
    if step < warmup:
        return lr * (step + 1) / warmup
    if total <= warmup:
        return lr
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    return lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * t)))


@torch.no_grad()
def eval_windows(model, windows, batch=32):
    """windows: int64 [n_win, ctx] on the GPU. Float32 forward. Returns per-position NLL (float64) and argmax
    for the predictions of positions 0..ctx-2 (targets 1..ctx-1): both [n_win, ctx-1]."""
    was_training = model.training
    model.eval()
    nll, arg = [], []
    for i in range(0, windows.shape[0], batch):
        x = windows[i:i + batch]
        logits = model(input_ids=x, use_cache=False).logits[:, :-1, :].float()
        lp = torch.log_softmax(logits.double(), dim=-1)
        nll.append(-lp.gather(-1, x[:, 1:].unsqueeze(-1)).squeeze(-1))
        arg.append(logits.argmax(dim=-1))
    model.train(was_training)
    return torch.cat(nll), torch.cat(arg)


def ppl_stats(nll):
    """nll: float64 tensor of per-token NLLs. llama.cpp's estimate of the perplexity's standard error."""
    x = nll.flatten().double()
    n = x.numel()
    mean = x.mean().item()
    mean2 = (x * x).mean().item()
    ppl = math.exp(mean)
    var = mean2 - mean * mean
    err = ppl * math.sqrt(var / (n - 1)) if n > 1 and var > 0 else 0.0
    return {"loss": mean, "ppl": ppl, "ppl_err": err, "n_tokens_scored": n}


@torch.no_grad()
def greedy(model, prompt_ids, n, device):
    """Greedy continuation in float32, one full forward per token (no KV cache). Also the smallest top-1 minus
    top-2 logit margin along the way (how robust the sequence is to tiny numeric differences)."""
    was_training = model.training
    model.eval()
    ids = list(prompt_ids)
    out, margin = [], float("inf")
    for _ in range(n):
        x = torch.tensor([ids], dtype=torch.long, device=device)
        logits = model(input_ids=x, use_cache=False).logits[0, -1].float()
        top = torch.topk(logits, 2)
        margin = min(margin, (top.values[0] - top.values[1]).item())
        t = int(top.indices[0].item())
        ids.append(t)
        out.append(t)
    model.train(was_training)
    return out, margin


def train_model(name, cfg, train_ids, val_windows, seconds, steps, epochs, lr, dropout, seed, device,
                extra_ids=None, teacher=None, distill=0.0):
    log(f"{name}: building")
    seed_all(seed)
    model = LlamaForCausalLM(cfg).to(device=device, dtype=torch.float32)
    n_params, n_non_emb = count_params(model)
    log(f"{name}: {n_params:,} parameters ({n_non_emb:,} without the tied embedding), "
        f"hidden {cfg.hidden_size}, {cfg.num_hidden_layers} layers, {cfg.num_attention_heads} heads / "
        f"{cfg.num_key_value_heads} kv, MLP {cfg.intermediate_size}, dropout {dropout}")
    hooks = add_residual_dropout(model, dropout)
    model.train()

    decay = [p for n_, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n_, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)
    ctx, bs = args.ctx, args.batch_size
    n_train = train_ids.numel() + (extra_ids.numel() if extra_ids is not None else 0)
    offsets = torch.arange(ctx + 1, device=device)
    n_extra = round(bs * args.extra_fraction) if extra_ids is not None else 0

    def windows(ids, n):
        starts = torch.randint(0, ids.numel() - ctx - 1, (n,), generator=gen).to(device)
        return ids[starts.unsqueeze(1) + offsets]

    def batch():
        xy = windows(train_ids, bs - n_extra)
        if n_extra:
            xy = torch.cat([xy, windows(extra_ids, n_extra)])
        return xy[:, :-1], xy[:, 1:]

    def val_loss():
        nll, _ = eval_windows(model, val_windows)
        return nll.mean().item()

    history = []
    loss0 = val_loss()  # the first call pays for CUDA/cuBLAS initialisation: time the second
    torch.cuda.synchronize()
    t_eval = time.time()
    val_loss()
    eval_s = time.time() - t_eval
    history.append([0, loss0])
    log(f"{name}: step 0 val loss {loss0:.4f} (ln V = {math.log(cfg.vocab_size):.4f}), eval {eval_s:.2f} s")

    # The step count: --*-steps if given; else the --*-epochs count, cut down to what the time budget allows
    # (measured over steps calib_from..calib_to, inside the warm-up, whose learning rate needs no total).
    epoch_steps = math.ceil(epochs * n_train / (bs * ctx)) if epochs > 0 else None
    if steps > 0:
        total, limited_by = steps, "steps"
    else:
        total, limited_by = epoch_steps, "epochs"
    calib_from, calib_to = 10, 40
    eval_every = max(1, total // args.n_evals) if total else None
    best = (float("inf"), -1, None)
    since_best = 0
    early_stopped = False
    train_loss_ema = None
    torch.cuda.synchronize()
    t0 = time.time()
    t_calib = None
    step = 0
    while True:
        if total is not None and step >= total:
            break
        if steps <= 0 and step == calib_from:
            torch.cuda.synchronize()
            t_calib = time.time()
        if steps <= 0 and step == calib_to:
            torch.cuda.synchronize()
            per_step = (time.time() - t_calib) / (calib_to - calib_from)
            spent = time.time() - t0
            # Leave room for the evaluations (n_evals of them) and a 3% margin.
            left = max(0.0, (seconds - spent) * 0.97 - args.n_evals * eval_s)
            time_steps = max(step + 1, step + int(left / per_step), args.warmup + 1)
            if total is None or time_steps < total:
                total, limited_by = time_steps, "time"
            eval_every = max(1, total // args.n_evals)
            log(f"{name}: {per_step * 1e3:.2f} ms per step; {time_steps} steps fit in the {seconds:.0f} s budget"
                f"{f', {epoch_steps} make {epochs:g} epochs' if epoch_steps else ''} -> {total} steps "
                f"(~{total * per_step:.0f} s), evaluating every {eval_every}")
        cur_lr = lr_at(step, total if total is not None else 10**9, args.warmup, lr)
        for g in opt.param_groups:
            g["lr"] = cur_lr
        x, y = batch()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=x, use_cache=False).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
        if teacher is not None and distill > 0:
            with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
                t_logits = teacher(input_ids=x, use_cache=False).logits
            kl = F.kl_div(F.log_softmax(logits.float(), -1).reshape(-1, logits.shape[-1]),
                          F.log_softmax(t_logits.float(), -1).reshape(-1, logits.shape[-1]),
                          log_target=True, reduction="batchmean")
            loss = (1.0 - distill) * loss + distill * kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 50 == 0 or (eval_every and step % eval_every == 0):
            lv = loss.item()
            train_loss_ema = lv if train_loss_ema is None else 0.9 * train_loss_ema + 0.1 * lv
        if eval_every and (step % eval_every == 0 or step == total):
            vl = val_loss()
            history.append([step, vl])
            improved = vl < best[0]
            if improved:
                best = (vl, step, {k: v.detach().clone() for k, v in model.state_dict().items()})
                since_best = 0
            else:
                since_best += 1
            log(f"{name}: step {step}/{total} lr {cur_lr:.2e} train loss {train_loss_ema:.4f} "
                f"val loss {vl:.4f}{' *' if improved else ''} ({time.time() - t0:.1f} s)")
            if args.patience > 0 and since_best >= args.patience and step < total:
                log(f"{name}: no better validation loss in {since_best} evaluations: stopping")
                early_stopped = True
                break
        if steps <= 0 and time.time() - t0 > seconds * 1.25:
            log(f"{name}: past 125% of the time budget: stopping at step {step}")
            early_stopped = True
            break
    torch.cuda.synchronize()
    train_s = time.time() - t0
    for h in hooks:
        h.remove()
    if best[2] is not None:
        model.load_state_dict(best[2])
    model.eval()
    log(f"{name}: trained {step} steps in {train_s:.1f} s; best val loss {best[0]:.4f} at step {best[1]}")
    stats = {
        "config": {"hidden_size": cfg.hidden_size, "num_hidden_layers": cfg.num_hidden_layers,
                   "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
                   "head_dim": cfg.head_dim, "intermediate_size": cfg.intermediate_size,
                   "vocab_size": cfg.vocab_size, "max_position_embeddings": cfg.max_position_embeddings,
                   "tie_word_embeddings": True},
        "n_params": n_params,
        "n_params_non_embedding": n_non_emb,
        "lr": lr,
        "dropout": dropout,
        "distill": distill if teacher is not None else 0.0,
        "extra_fraction": args.extra_fraction if extra_ids is not None else 0.0,
        "batch_size": bs,
        "steps_planned": total,
        "steps_limited_by": limited_by,
        "epochs_planned": epochs if epochs > 0 else None,
        "steps": step,
        "tokens_seen": step * bs * ctx,
        "epochs": step * bs * ctx / n_train,
        "best_step": best[1],
        "early_stopped": early_stopped,
        "train_seconds": train_s,
        "time_budget_seconds": None if steps > 0 else seconds,
        "final_train_loss_ema": train_loss_ema,
        "eval_history": history,
    }
    return model, stats


def main():
    if not torch.cuda.is_available():
        sys.exit("train_tiny.py needs a CUDA GPU")
    device = torch.device("cuda")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    torch.set_float32_matmul_precision("highest")  # float32 evaluation without TF32
    seed_all(args.seed)
    log(f"torch {torch.__version__}, transformers {transformers.__version__}, tokenizers "
        f"{tokenizers.__version__}, {torch.cuda.get_device_name(0)}")

    text, sha = load_text(args.data)
    split = int(len(text) * (1.0 - args.val_fraction))
    train_text, val_text = text[:split], text[split:]
    log(f"data: {args.data}: {len(text):,} characters, train {len(train_text):,}, validation {len(val_text):,}")

    t = time.time()
    tok = train_tokenizer(train_text, args.vocab_size)
    tok_s = time.time() - t
    vocab = tok.get_vocab_size()
    train_ids_list = encode(tok, train_text)
    val_ids = encode(tok, val_text)
    log(f"tokenizer: vocab {vocab} in {tok_s:.1f} s; train {len(train_ids_list):,} tokens "
        f"({len(train_text) / len(train_ids_list):.2f} chars/token), validation {len(val_ids):,} tokens")
    round_trip = tok.decode(val_ids, skip_special_tokens=False) == val_text
    if not round_trip:
        log("WARNING: decode(encode(validation text)) differs from the validation text")

    ctx = args.ctx
    train_ids = torch.tensor(train_ids_list, dtype=torch.long, device=device)
    extra_ids, extra_info = None, []
    for path in args.extra_data:
        etext, esha = load_text(path)
        eids = encode(tok, etext)
        extra_info.append({"path": path, "sha256": esha, "n_chars": len(etext), "n_tokens": len(eids)})
        log(f"extra training text: {path}: {len(etext):,} characters, {len(eids):,} tokens")
        e = torch.tensor(eids, dtype=torch.long, device=device)
        extra_ids = e if extra_ids is None else torch.cat([extra_ids, e])
    n_val_win = len(val_ids) // ctx
    val_windows = torch.tensor(val_ids[:n_val_win * ctx], dtype=torch.long, device=device).view(n_val_win, ctx)
    log(f"validation: {n_val_win} windows of {ctx} tokens ({len(val_ids) - n_val_win * ctx} tail tokens dropped)")

    target_cfg = make_config(vocab, *map(int, args.target_shape.split(",")), ctx)
    draft_cfg = make_config(vocab, *map(int, args.draft_shape.split(",")), ctx)
    target, target_stats = train_model("target", target_cfg, train_ids, val_windows, args.target_seconds,
                                       args.target_steps, args.target_epochs, args.target_lr, args.target_dropout,
                                       args.seed, device, extra_ids)
    target.eval()
    first_target_stats = None
    if args.target_distill > 0:
        teacher, first_target_stats = target, target_stats
        nll, _ = eval_windows(teacher, val_windows)
        first_target_stats["val_ppl"] = ppl_stats(nll)["ppl"]
        target, target_stats = train_model("target (born-again)", target_cfg, train_ids, val_windows,
                                           args.target_seconds, args.target_steps, args.target_epochs,
                                           args.target_lr, args.target_dropout, args.seed + 2, device, extra_ids,
                                           teacher, args.target_distill)
        target.eval()
        del teacher
    draft, draft_stats = train_model("draft", draft_cfg, train_ids, val_windows, args.draft_seconds,
                                     args.draft_steps, args.draft_epochs, args.draft_lr, args.draft_dropout,
                                     args.seed + 1, device, extra_ids, target, args.draft_distill)
    models_ = [("target", target, target_stats, args.out_target), ("draft", draft, draft_stats, args.out_draft)]
    if args.draft_distill_alt >= 0:
        alt, alt_stats = train_model("draft_alt", draft_cfg, train_ids, val_windows, args.draft_seconds,
                                     args.draft_steps, args.draft_epochs, args.draft_lr, args.draft_dropout,
                                     args.seed + 1, device, extra_ids, target, args.draft_distill_alt)
        models_.append(("draft_alt", alt, alt_stats, args.out_draft + "_alt"))

    # ---- evaluation (float32)
    first = ctx // 2
    results = {}
    args_by_name = {}
    for name, model, stats, _ in models_:
        nll, arg = eval_windows(model, val_windows)
        args_by_name[name] = arg
        allp = ppl_stats(nll)
        half = ppl_stats(nll[:, first:])  # llama.cpp: positions [ctx/2, ctx-1)
        acc = (arg == val_windows[:, 1:]).double().mean().item()
        stats["val"] = {
            "loss": allp["loss"], "ppl": allp["ppl"], "ppl_err": allp["ppl_err"],
            "n_tokens_scored": allp["n_tokens_scored"], "n_windows": n_val_win, "window": ctx,
            "second_half": {"loss": half["loss"], "ppl": half["ppl"], "ppl_err": half["ppl_err"],
                            "n_tokens_scored": half["n_tokens_scored"], "first_position": first},
            "top1_accuracy": acc,
        }
        prompt_ids = encode(tok, args.prompt)
        gen_ids, margin = greedy(model, prompt_ids, args.n_generate, device)
        stats["greedy"] = {"prompt": args.prompt, "prompt_ids": prompt_ids, "ids": gen_ids,
                           "text": tok.decode(gen_ids, skip_special_tokens=False), "min_margin": margin}
        log(f"{name}: val loss {allp['loss']:.4f} ppl {allp['ppl']:.3f} +/- {allp['ppl_err']:.3f}; "
            f"second half ppl {half['ppl']:.3f} +/- {half['ppl_err']:.3f}; top-1 accuracy {acc:.4f}")
        log(f"{name}: greedy {args.prompt!r} -> {stats['greedy']['text']!r} (min margin {margin:.4f})")
        # The shipped GGUF holds the 2-D weight matrices in F16 (norms F32): the same numbers with those
        # matrices rounded to F16 and computed in float32 are the exact reference for it.
        m16 = copy.deepcopy(model)
        with torch.no_grad():
            for p_ in m16.parameters():
                if p_.dim() == 2:
                    p_.copy_(p_.to(torch.float16).to(torch.float32))
        nll16, _ = eval_windows(m16, val_windows)
        all16, half16 = ppl_stats(nll16), ppl_stats(nll16[:, first:])
        g16, margin16 = greedy(m16, prompt_ids, args.n_generate, device)
        stats["f16w"] = {"loss": all16["loss"], "ppl": all16["ppl"], "second_half_ppl": half16["ppl"],
                         "greedy_ids": g16, "greedy_min_margin": margin16,
                         "greedy_text": tok.decode(g16, skip_special_tokens=False)}
        log(f"{name} (F16 weights): val ppl {all16['ppl']:.3f}; second half {half16['ppl']:.3f}; "
            f"greedy {stats['f16w']['greedy_text']!r}")
        del m16
        results[name] = stats
    agreements = {}
    for name in args_by_name:
        if name == "target":
            continue
        agree = (args_by_name["target"] == args_by_name[name]).double()
        agreements[name] = {"fraction": agree.mean().item(), "n_positions": agree.numel(),
                            "positions": f"0..{ctx - 2} of each validation window"}
        log(f"{name}/target greedy agreement: {agreements[name]['fraction']:.4f} over {agree.numel()} positions")
    agreement = agreements["draft"]

    # ---- save
    for name, model, _, out in models_:
        os.makedirs(out, exist_ok=True)
        model.save_pretrained(out)
        save_tokenizer(tok, out, ctx)
        # Reload check: the saved float32 checkpoint gives the same logits.
        re = LlamaForCausalLM.from_pretrained(out, dtype=torch.float32).to(device).eval()
        with torch.no_grad():
            a = model(input_ids=val_windows[:2], use_cache=False).logits
            b = re(input_ids=val_windows[:2], use_cache=False).logits
        diff = (a - b).abs().max().item()
        results[name]["reload_max_abs_logit_diff"] = diff
        results[name]["out_dir"] = out
        log(f"{name}: saved to {out} (reload max |logit diff| {diff:.2e}): {sorted(os.listdir(out))}")
        del re
    try:  # the transformers tokenizer reads the same files and gives the same ids
        from transformers import AutoTokenizer
        ht = AutoTokenizer.from_pretrained(args.out_target)
        same = ht(val_text[:5000], add_special_tokens=False)["input_ids"] == encode(tok, val_text[:5000])
        log(f"AutoTokenizer reload: ids {'match' if same else 'DIFFER'}")
        results["target"]["auto_tokenizer_ids_match"] = same
    except Exception as e:  # informational only
        log(f"AutoTokenizer reload failed (informational): {e!r}")

    report_dir = os.path.dirname(os.path.abspath(args.report))
    os.makedirs(report_dir, exist_ok=True)
    with open(os.path.join(report_dir, "val_ids.txt"), "w") as f:
        f.write(" ".join(map(str, val_ids)) + "\n")
    with open(os.path.join(report_dir, "val.txt"), "w", encoding="utf-8", newline="") as f:
        f.write(val_text)
    report = {
        "script": "tools/train_tiny.py",
        "argv": sys.argv[1:],
        "args": vars(args),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "tokenizers": tokenizers.__version__, "cuda": torch.version.cuda,
                     "device": torch.cuda.get_device_name(0)},
        "data": {"path": args.data, "sha256": sha, "n_chars": len(text), "n_train_chars": len(train_text),
                 "n_val_chars": len(val_text), "split": f"first {1 - args.val_fraction:.0%} / last "
                 f"{args.val_fraction:.0%} of the characters", "extra_training_text": extra_info},
        "tokenizer": {"type": "byte-level BPE (HF tokenizers)", "vocab_size": vocab,
                      "special_tokens": {SPECIAL: 0}, "bos_id": 0, "eos_id": 0, "add_bos": False,
                      "add_eos": False, "train_seconds": tok_s, "round_trip": round_trip,
                      "n_train_tokens": len(train_ids_list),
                      "n_val_tokens": len(val_ids)},
        "ctx": ctx,
        "target": results["target"],
        "draft": results["draft"],
        "draft_agreement": agreement,
        "first_target": first_target_stats,
        "draft_alt": results.get("draft_alt"),
        "draft_alt_agreement": agreements.get("draft_alt"),
        "total_seconds": time.time() - T_START,
        "val_ids_file": "val_ids.txt",
        "val_text_file": "val.txt",
        "val_ids": val_ids,
    }
    with open(args.report, "w") as f:
        json.dump(report, f, indent=1)
    log(f"report: {args.report}; total {report['total_seconds']:.1f} s")
    summary = {k: {"n_params": results[k]["n_params"], "train_seconds": round(results[k]["train_seconds"], 1),
                   "steps": results[k]["steps"], "val_loss": round(results[k]["val"]["loss"], 4),
                   "val_ppl": round(results[k]["val"]["ppl"], 3)} for k in results}
    print(json.dumps({"summary": summary, "agreement": {k: round(v["fraction"], 4) for k, v in agreements.items()},
                      "first_target_val_ppl": first_target_stats and first_target_stats["val_ppl"]}), flush=True)


if __name__ == "__main__":
    main()
