#!/usr/bin/env python3
"""Tiny random gpt-oss (GptOssForCausalLM) reference fixtures from HF transformers (issue 34).

Run on a machine with torch + transformers (the GPU machine; everything runs on its CPU in float32):
    python3 tools/make_gptoss_fixture.py --out tests/fixtures/hf

It writes two checkpoints in the Hub's on-disk layout, built here tensor by tensor (not by save_pretrained, so
the files have the layout of the published checkpoints whatever this transformers version keeps in memory),
then loads each with GptOssForCausalLM.from_pretrained and records what transformers computes:

  <out>/gpt_oss/        experts as the dequantised (BF16-layout) Hub checkpoints store them, here in float32:
                        mlp.experts.gate_up_proj [E, D, 2F] (x @ W; gate in the even columns, up in the odd ones),
                        gate_up_proj_bias [E, 2F] (interleaved alike), down_proj [E, F, D], down_proj_bias [E, D];
                        mlp.router.weight [E, D] + bias [E]; self_attn.sinks [n_heads]; q/k/v/o with biases.
  <out>/gpt_oss_mxfp4/  the same architecture with other random weights whose experts are stored as
                        openai/gpt-oss-20b stores them: *_blocks [E, rows, cols/32, 16] uint8 (two E2M1 codes a
                        byte, the low nibble first) and *_scales [E, rows, cols/32] uint8 (E8M0: 2^(s-127)), with
                        config.json's quantization_config {"quant_method": "mxfp4"}. Its logits are those of the
                        dequantised weights (transformers' convert_moe_packed_tensors arithmetic, exact in f32),
                        loaded as a plain checkpoint; transformers' own MXFP4 loading (Mxfp4Config(dequantize=True))
                        is tried too and its agreement recorded in reference.json.

Each directory gets config.json, model.safetensors, reference.json (prompt ids, 32 greedy ids and margins, the
layers' RoPE inverse frequencies and YaRN attention factor as transformers computed them, versions) and
logits_f32.bin ([n_prompt, n_vocab] float32, every prompt position). gpt_oss also gets logits_f16w.bin /
logits_bf16w.bin / logits_q8_0w.bin: every weight matrix (embeddings, q/k/v/o, each expert's gate, up and down
as the [rows, cols] matrices a GGUF file stores, lm_head; not the router) rounded to F16 / BF16 / Q8_0 (per
32-block along cols), computed in float32: the references for `ultra convert --type f16|bf16|q8_0`.

The model: 4 layers alternating sliding (window 8) / full attention, a 24-token prompt (so the window matters),
hidden 64, 4 heads of 24 (head_dim != hidden / heads), 2 KV heads, 4 experts of 64 with top 2, YaRN as
gpt-oss-20b has it (theta 150000, factor 32, original context 4096, beta 32 / 1, truncate false), the clamped
SwiGLU (limit 7: the expert weights are scaled up so that the clamp is hit; reference.json counts how often).
"""
import argparse
import json
import math
import os
import shutil
import tempfile

import numpy
import torch
import transformers
from safetensors.torch import save_file

# the references' helpers, shared with the other fixtures (llama.cpp's Q8_0 rounding, greedy decoding)
from make_fixtures import greedy, prompt_logits, round_bf16, round_f16, round_q8_0, save_logits

VOCAB = 320
HIDDEN = 64
FFN = 64  # intermediate_size: each expert's width
N_LAYERS = 4
N_HEADS = 4
N_KV = 2
HEAD_DIM = 24
N_EXPERT = 4
TOP_K = 2
WINDOW = 8
N_PROMPT = 24
N_GREEDY = 32
LIMIT = 7.0  # GptOssExperts.limit / config swiglu_limit
FP4_VALUES = [+0.0, +0.5, +1.0, +1.5, +2.0, +3.0, +4.0, +6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def config_json(mxfp4):
    """config.json in the form openai/gpt-oss-20b publishes it (transformers-4 rope_scaling at the top level)."""
    cfg = {
        "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "attention_bias": True,
        "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
        "experts_per_token": TOP_K, "num_experts_per_tok": TOP_K, "num_local_experts": N_EXPERT,
        "head_dim": HEAD_DIM, "hidden_act": "silu", "hidden_size": HIDDEN, "initial_context_length": 4096,
        "initializer_range": 0.02, "intermediate_size": FFN,
        "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(N_LAYERS)],
        "max_position_embeddings": 131072, "num_attention_heads": N_HEADS, "num_hidden_layers": N_LAYERS,
        "num_key_value_heads": N_KV, "output_router_logits": False, "rms_norm_eps": 1e-5,
        "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                         "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": False},
        "rope_theta": 150000.0, "router_aux_loss_coef": 0.9, "sliding_window": WINDOW, "swiglu_limit": LIMIT,
        "tie_word_embeddings": False, "use_cache": True, "vocab_size": VOCAB,
    }
    if mxfp4:
        cfg["quantization_config"] = {
            "quant_method": "mxfp4",
            "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                       "model.embed_tokens", "lm_head"]}
    return cfg


def dense_weights(seed):
    """The Hub-layout state dict (float32) with enough spread that greedy decisions are not near-ties."""
    g = torch.Generator().manual_seed(seed)

    def mat(*shape, fan_in, scale=1.5):
        return torch.randn(shape, generator=g) / math.sqrt(fan_in) * scale

    def vec(*shape, scale=0.3):
        return scale * torch.randn(shape, generator=g)

    sd = {"model.embed_tokens.weight": torch.randn(VOCAB, HIDDEN, generator=g)}
    q_dim, kv_dim = N_HEADS * HEAD_DIM, N_KV * HEAD_DIM
    for il in range(N_LAYERS):
        p = f"model.layers.{il}."
        sd[p + "input_layernorm.weight"] = 1.0 + vec(HIDDEN, scale=0.2)
        sd[p + "post_attention_layernorm.weight"] = 1.0 + vec(HIDDEN, scale=0.2)
        for name, rows in (("q_proj", q_dim), ("k_proj", kv_dim), ("v_proj", kv_dim)):
            sd[p + f"self_attn.{name}.weight"] = mat(rows, HIDDEN, fan_in=HIDDEN)
            sd[p + f"self_attn.{name}.bias"] = vec(rows)
        sd[p + "self_attn.o_proj.weight"] = mat(HIDDEN, q_dim, fan_in=q_dim)
        sd[p + "self_attn.o_proj.bias"] = vec(HIDDEN)
        sd[p + "self_attn.sinks"] = vec(N_HEADS, scale=1.5)  # logits of the order of the scores
        sd[p + "mlp.router.weight"] = mat(N_EXPERT, HIDDEN, fan_in=HIDDEN, scale=2.0)
        sd[p + "mlp.router.bias"] = vec(N_EXPERT)
        # scaled so that |gate|, |up| > LIMIT for a fair share of the values: the clamp matters
        sd[p + "mlp.experts.gate_up_proj"] = mat(N_EXPERT, HIDDEN, 2 * FFN, fan_in=HIDDEN, scale=5.0)
        sd[p + "mlp.experts.gate_up_proj_bias"] = vec(N_EXPERT, 2 * FFN, scale=1.0)
        sd[p + "mlp.experts.down_proj"] = mat(N_EXPERT, FFN, HIDDEN, fan_in=FFN, scale=0.3)
        sd[p + "mlp.experts.down_proj_bias"] = vec(N_EXPERT, HIDDEN)
    sd["model.norm.weight"] = 1.0 + vec(HIDDEN, scale=0.2)
    sd["lm_head.weight"] = mat(VOCAB, HIDDEN, fan_in=HIDDEN)
    return sd


def mxfp4_dequant(blocks, scales):
    """transformers' convert_moe_packed_tensors in float32: [E, rows, G, 16] codes + [E, rows, G] exponents
    -> [E, G * 32, rows] (x @ W layout). Every value is a code times a power of two: exact in f32 and BF16."""
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32)
    e, rows, n_groups, _ = blocks.shape
    out = torch.empty(e, rows, n_groups, 32, dtype=torch.float32)
    out[..., 0::2] = lut[(blocks & 0x0F).long()]
    out[..., 1::2] = lut[(blocks >> 4).long()]
    out = torch.ldexp(out, (scales.to(torch.int32) - 127)[..., None])
    return out.reshape(e, rows, n_groups * 32).transpose(1, 2).contiguous()


def mxfp4_experts(sd, seed):
    """Replaces sd's expert matrices with random MXFP4 ones; returns (the file's tensors, sd dequantised)."""
    g = torch.Generator().manual_seed(seed)
    file_sd = {k: v for k, v in sd.items() if not k.endswith(("gate_up_proj", "down_proj"))}
    deq = dict(file_sd)
    for il in range(N_LAYERS):
        p = f"model.layers.{il}.mlp.experts."
        # (name, rows = output features, cols = input features, exponent range): the dequantised values
        # have about the spread of dense_weights' (gate_up ~0.6, down ~0.04)
        for name, rows, cols, lo, hi in (("gate_up_proj", 2 * FFN, HIDDEN, 121, 125),
                                         ("down_proj", HIDDEN, FFN, 116, 120)):
            blocks = torch.randint(0, 256, (N_EXPERT, rows, cols // 32, 16), generator=g, dtype=torch.uint8)
            scales = torch.randint(lo, hi + 1, (N_EXPERT, rows, cols // 32), generator=g, dtype=torch.uint8)
            file_sd[p + name + "_blocks"] = blocks
            file_sd[p + name + "_scales"] = scales
            deq[p + name] = mxfp4_dequant(blocks, scales)
    return file_sd, deq


def save_checkpoint(d, sd, cfg):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    save_file({k: v.contiguous() for k, v in sd.items()}, os.path.join(d, "model.safetensors"),
              metadata={"format": "pt"})


def load(d, **kw):
    from transformers import GptOssForCausalLM
    model, info = GptOssForCausalLM.from_pretrained(d, attn_implementation="eager", dtype=torch.float32,
                                                    output_loading_info=True, **kw)
    bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    assert not bad, f"{d}: transformers did not load the checkpoint as written: {bad}"
    return model.eval()


def check_loaded(model, sd):
    """Every tensor written must be in the loaded model as written. The fused experts may be kept in another
    layout by this transformers version (transposed, or gate and up de-interleaved by its checkpoint
    conversion): reported, not refused, as transformers loads the Hub's checkpoints the same way."""
    have = model.state_dict()
    for k, v in sd.items():
        if k not in have:
            print(f"note: {k} is not a parameter of this transformers version's model (converted at load)")
            continue
        t = have[k].detach().to(torch.float32)
        ok = t.shape == v.shape and torch.equal(t, v)
        if v.dim() == 3 and not ok:
            print(f"note: {k} is kept as {tuple(t.shape)} in memory (the file's {tuple(v.shape)})")
            continue
        assert ok, f"{k}: loaded {tuple(t.shape)} differs from the file's {tuple(v.shape)}"


def rope_info(model):
    """The RoPE inverse frequencies and attention factor transformers uses (YaRN must have applied)."""
    rot = getattr(model.model, "rotary_emb", None)
    if rot is None:
        rot = model.model.layers[0].self_attn.rotary_emb
    inv = [float(x) for x in rot.inv_freq.to(torch.float64)]
    scaling = float(rot.attention_scaling)
    assert abs(scaling - (0.1 * math.log(32.0) + 1.0)) < 1e-6, f"YaRN attention factor {scaling}: not applied?"
    return inv, scaling


@torch.no_grad()
def clamp_share(model, sd, ids):
    """The share of the selected and unselected experts' gate / up pre-activations beyond +-LIMIT at the
    prompt (the fixture must exercise the clamp)."""
    seen = []
    hooks = [layer.mlp.register_forward_pre_hook(lambda m, a: seen.append(a[0].reshape(-1, HIDDEN)))
             for layer in model.model.layers]
    model(torch.tensor([ids]))
    for h in hooks:
        h.remove()
    over = total = 0
    for il, x in enumerate(seen):
        p = f"model.layers.{il}.mlp.experts."
        gu = torch.einsum("td,edf->etf", x, sd[p + "gate_up_proj"]) + sd[p + "gate_up_proj_bias"][:, None, :]
        over += int((gu[..., 0::2] > LIMIT).sum() + (gu[..., 1::2].abs() > LIMIT).sum())
        total += gu.numel()
    return over / total


def check_window_applies(sd, cfg, ids, ref):
    """The saved logits must be windowed: the first WINDOW positions equal those of the same weights with a
    window longer than the prompt, the later ones differ."""
    with tempfile.TemporaryDirectory() as td:
        wide = dict(cfg, sliding_window=4096)
        save_checkpoint(td, sd, wide)
        f = prompt_logits(load(td), ids)
    assert torch.allclose(f[:WINDOW], ref[:WINDOW], atol=1e-5), "windowed logits differ before the window"
    assert (f[WINDOW:] - ref[WINDOW:]).abs().max() > 1e-3, "the sliding window changed nothing"


def rounded(sd, fn):
    """sd with every matrix a GGUF file stores rounded by fn along its rows ([rows = out, cols = in]); the
    experts' x @ W tensors are [E, in, out], so each expert's transpose is rounded. The router stays F32."""
    out = {}
    for k, v in sd.items():
        if k.endswith(("gate_up_proj", "down_proj")) and v.dim() == 3:
            out[k] = torch.stack([fn(v[e].t().contiguous()).t() for e in range(v.shape[0])]).contiguous()
        elif v.dim() == 2 and not k.endswith("router.weight") and not k.endswith("_bias"):
            out[k] = fn(v)
        else:
            out[k] = v
    return out


def write_fixture(d, file_sd, ref_sd, cfg, ids, extra_variants, note):
    """Saves file_sd (what the engine reads) and the references computed from ref_sd (its float32 values)."""
    shutil.rmtree(d, ignore_errors=True)
    save_checkpoint(d, file_sd, cfg)
    with tempfile.TemporaryDirectory() as td:
        plain = {k: v for k, v in cfg.items() if k != "quantization_config"}
        save_checkpoint(td, ref_sd, plain)
        model = load(td)
        check_loaded(model, ref_sd)
        ref = prompt_logits(model, ids)
        check_window_applies(ref_sd, plain, ids, ref)
        inv, attn = rope_info(model)
        gen, margins = greedy(model, ids, N_GREEDY)
        info = {"prompt": ids, "greedy": gen, "greedy_min_margin": min(margins), "n_vocab": VOCAB,
                "n_prompt": len(ids), "sliding_window": WINDOW, "rope_inv_freq": inv,
                "rope_attention_factor": attn, "clamped_share": clamp_share(model, ref_sd, ids),
                "transformers": transformers.__version__, "torch": torch.__version__,
                "architecture": "GptOssForCausalLM", "note": note}
        save_logits(os.path.join(d, "logits_f32.bin"), ref)
        for tag, fn in extra_variants:
            r_sd = rounded(ref_sd, fn)
            save_checkpoint(td, r_sd, plain)
            rm = load(td)
            save_logits(os.path.join(d, f"logits_{tag}.bin"), prompt_logits(rm, ids))
            info[f"greedy_{tag}"], _ = greedy(rm, ids, N_GREEDY)
    return ref, info


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-o", "--out", default="tests/fixtures/hf")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    os.makedirs(args.out, exist_ok=True)
    g = torch.Generator().manual_seed(4321)
    ids = [int(x) for x in torch.randint(3, VOCAB, (N_PROMPT,), generator=g)]
    summary = {}

    sd = dense_weights(500)
    d = os.path.join(args.out, "gpt_oss")
    _, info = write_fixture(d, sd, sd, config_json(False), ids,
                            (("f16w", round_f16), ("bf16w", round_bf16), ("q8_0w", round_q8_0)),
                            "experts in the dequantised Hub layout, float32")
    # the reference must be what transformers computes from the files exactly as saved
    saved = numpy.fromfile(os.path.join(d, "logits_f32.bin"), dtype="<f4").reshape(N_PROMPT, VOCAB)
    assert torch.equal(prompt_logits(load(d), ids), torch.from_numpy(saved))
    json.dump(info, open(os.path.join(d, "reference.json"), "w"), indent=1)
    summary["gpt_oss"] = {k: info[k] for k in ("greedy_min_margin", "clamped_share")}

    file_sd, deq = mxfp4_experts(dense_weights(501), 502)
    d = os.path.join(args.out, "gpt_oss_mxfp4")
    ref, info = write_fixture(d, file_sd, deq, config_json(True), ids, (),
                              "experts MXFP4 (*_blocks, *_scales) as openai/gpt-oss-20b; logits of the "
                              "dequantised weights")
    try:  # transformers' own MXFP4 path on this machine, for the record
        from transformers import Mxfp4Config
        mq = load(d, quantization_config=Mxfp4Config(dequantize=True))
        info["transformers_mxfp4_dequantize_max_abs"] = float((prompt_logits(mq, ids) - ref).abs().max())
    except Exception as e:  # noqa: BLE001
        info["transformers_mxfp4_dequantize_max_abs"] = f"not run: {e!r}"[:300]
    json.dump(info, open(os.path.join(d, "reference.json"), "w"), indent=1)
    summary["gpt_oss_mxfp4"] = {k: info[k] for k in ("greedy_min_margin", "clamped_share",
                                                      "transformers_mxfp4_dequantize_max_abs")}
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
