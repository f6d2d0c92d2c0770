#!/usr/bin/env python3
"""Reference fixtures from HF transformers for the engine's correctness tests.

Run on a machine with torch + transformers (the GPU machine; everything runs on its CPU in float32 for
exact, deterministic references):
    python3 tools/make_fixtures.py -o tests/fixtures/hf

For each tiny random-weight model it writes <out>/<name>/:
  config.json, model.safetensors     the HF checkpoint (float32)
  reference.json                     prompt ids, 32 greedy ids, shapes, greedy margins, versions
  logits_f32.bin                     [n_prompt, n_vocab] float32 logits of the prompt (all positions)
  logits_f16w.bin / logits_bf16w.bin / logits_q8_0w.bin
                                     the same with every 2-D weight matrix rounded to F16 / BF16 / Q8_0
                                     (norms and biases stay F32), computed in float32: the exact reference
                                     for a GGUF converted to that type, up to the engine's own f32 rounding.
mistral_swa (window 12) has a 40-token prompt: only it, after the others exist, with
    python3 tools/make_fixtures.py -o tests/fixtures/hf --only mistral_swa
(each model's seed is its place in the full list, so --only rewrites the same weights).
One model is also saved as a BF16 checkpoint (<name>_bf16/, all tensors BF16) with its logits.
One config is rewritten in the transformers-4 form (rope_theta / rope_scaling at the top level) after
checking that transformers loads it to identical logits.

The mixture-of-experts models (mixtral, qwen2_moe with its shared expert, qwen3_moe) are saved in the Hub's
layout whatever this transformers version keeps in memory: one tensor per expert
(model.layers.N.block_sparse_moe.experts.E.w1/w2/w3 for Mixtral, model.layers.N.mlp.experts.E.{gate,up,
down}_proj for Qwen), as the published checkpoints are; transformers must load that layout back to the
same logits. Only those three:
    python3 tools/make_fixtures.py -o tests/fixtures/hf --only mixtral,qwen2_moe,qwen3_moe
"""
import argparse
import json
import math
import os
import shutil

import torch
import transformers
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM)

N_PROMPT = 16
N_GREEDY = 32
VOCAB = 320
# Fixtures whose prompt is longer than N_PROMPT (drawn after the common prompt, which stays as it was).
LONG_PROMPT = {"mistral_swa": 40}
SWA_WINDOW = 12


def rope_kw(theta, scaling=None):
    """Config kwargs for RoPE in whichever form this transformers version takes."""
    major = int(transformers.__version__.split(".")[0])
    if major >= 5:
        params = {"rope_type": "default", "rope_theta": theta}
        if scaling:
            params.update(scaling)
        return {"rope_parameters": params}
    kw = {"rope_theta": theta}
    if scaling:
        kw["rope_scaling"] = scaling
    return kw


def common(**kw):
    base = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5,
                bos_token_id=1, eos_token_id=2, attn_implementation="eager")
    base.update(kw)
    return base


def new_models():
    """Architectures added for issue 12, built defensively: a constructor this transformers version does not
    take is reported and skipped instead of stopping the script."""
    out = {}

    def add(name, build):
        try:
            out[name] = build()
        except Exception as e:  # noqa: BLE001
            print(f"SKIPPED {name}: {e!r}", flush=True)

    def qwen3():
        from transformers import Qwen3Config, Qwen3ForCausalLM
        # head_dim 24 != hidden / heads = 16; q/k RMSNorm per head; tied embeddings.
        return Qwen3ForCausalLM, Qwen3Config(**common(head_dim=24, rms_norm_eps=1e-6, tie_word_embeddings=True,
                                                      attention_bias=False, **rope_kw(1000000.0)))

    def gemma2():
        from transformers import Gemma2Config, Gemma2ForCausalLM
        # 3 layers: sliding (window 6, shorter than the 16-token prompt), global, sliding.
        return Gemma2ForCausalLM, Gemma2Config(**common(
            num_hidden_layers=3, head_dim=16, query_pre_attn_scalar=24, attn_logit_softcapping=50.0,
            final_logit_softcapping=30.0, sliding_window=6, hidden_activation="gelu_pytorch_tanh",
            tie_word_embeddings=True, pad_token_id=0, **rope_kw(10000.0)))

    def gemma3():
        from transformers import Gemma3ForCausalLM, Gemma3TextConfig
        kw = common(num_hidden_layers=4, head_dim=16, query_pre_attn_scalar=16, sliding_window=6,
                    hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True, pad_token_id=0,
                    layer_types=["sliding_attention", "sliding_attention", "sliding_attention",
                                 "full_attention"])
        major = int(transformers.__version__.split(".")[0])
        if major >= 5:  # per layer type: global layers linear-scaled with base 1e6, local ones base 1e4
            kw["rope_parameters"] = {
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}
        else:
            kw.update(rope_theta=1000000.0, rope_local_base_freq=10000.0,
                      rope_scaling={"rope_type": "linear", "factor": 8.0})
        return Gemma3ForCausalLM, Gemma3TextConfig(**kw)

    def phi3(orig):
        from transformers import Phi3Config, Phi3ForCausalLM
        hd = 16
        short = [1.0 + 0.1 * i for i in range(hd // 2)]
        long = [1.0 + 0.9 * i for i in range(hd // 2)]
        scaling = {"rope_type": "longrope", "short_factor": short, "long_factor": long,
                   "original_max_position_embeddings": orig}
        kw = common(num_key_value_heads=4, tie_word_embeddings=False, pad_token_id=0, max_position_embeddings=256)
        major = int(transformers.__version__.split(".")[0])
        if major >= 5:
            kw["rope_parameters"] = dict(scaling, rope_theta=10000.0)
            kw["original_max_position_embeddings"] = orig
        else:
            kw.update(rope_theta=10000.0, rope_scaling={"type": "longrope", "short_factor": short,
                                                        "long_factor": long},
                      original_max_position_embeddings=orig)
        return Phi3ForCausalLM, Phi3Config(**kw)

    def mixtral():
        from transformers import MixtralConfig, MixtralForCausalLM
        # 4 experts of intermediate_size 64 (the files stay ~0.5 MB), top 2 renormalised (Mixtral always does).
        return MixtralForCausalLM, MixtralConfig(**common(num_local_experts=4, num_experts_per_tok=2,
                                                          intermediate_size=64,
                                                          sliding_window=None, router_jitter_noise=0.0,
                                                          **rope_kw(1000000.0)))

    def qwen2_moe():
        from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM
        # 4 experts of 64, top 2 not renormalised (Qwen1.5-MoE's norm_topk_prob false), a shared expert of 96
        # with its sigmoid gate; every layer sparse; q/k/v biases.
        return Qwen2MoeForCausalLM, Qwen2MoeConfig(**common(
            num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=96,
            norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[], use_sliding_window=False,
            rms_norm_eps=1e-6, tie_word_embeddings=False, **rope_kw(1000000.0)))

    def qwen3_moe():
        from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
        # 4 experts of 64, top 2 renormalised (norm_topk_prob, as Qwen3-30B-A3B); q/k norms; head_dim 24.
        return Qwen3MoeForCausalLM, Qwen3MoeConfig(**common(
            num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, norm_topk_prob=True,
            decoder_sparse_step=1, mlp_only_layers=[], head_dim=24, attention_bias=False, rms_norm_eps=1e-6,
            tie_word_embeddings=False, use_sliding_window=False, **rope_kw(1000000.0)))

    add("qwen3", qwen3)
    add("gemma2", gemma2)
    add("gemma3", gemma3)
    add("phi3_short", lambda: phi3(64))  # prompt + greedy (48 tokens) within the original context: short factors
    add("phi3_long", lambda: phi3(8))    # past it from the prompt on: long factors and the attention factor
    # Issue 34: Mistral's whole-model sliding window (12) shorter than its 40-token prompt (LONG_PROMPT).
    add("mistral_swa", lambda: (MistralForCausalLM, MistralConfig(**common(
        sliding_window=SWA_WINDOW, head_dim=32, **rope_kw(10000.0)))))
    add("mixtral", mixtral)
    add("qwen2_moe", qwen2_moe)
    add("qwen3_moe", qwen3_moe)
    return out


MOE_FIXTURES = ("mixtral", "qwen2_moe", "qwen3_moe")


def hub_state_dict(model, mixtral):
    """The state dict in the Hub's per-expert layout. transformers 4 keeps one module per expert already
    (passed through); transformers 5 may fuse them into mlp.experts.gate_up_proj [E, 2F, D] (gate rows first)
    and mlp.experts.down_proj [E, D, F] (either possibly stored transposed), which are split here."""
    cfg = model.config
    d = cfg.hidden_size
    f = cfg.intermediate_size if mixtral else cfg.moe_intermediate_size
    out = {}
    names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
    for k, v in model.state_dict().items():
        v = v.detach().to(torch.float32).contiguous()
        if mixtral:
            k = k.replace(".mlp.gate.", ".block_sparse_moe.gate.").replace(".mlp.experts.", ".block_sparse_moe.experts.")
        base, _, leaf = k.rpartition(".experts.")
        if leaf in ("gate_up_proj", "down_proj") and v.dim() == 3:
            n_exp = v.shape[0]
            if leaf == "gate_up_proj":
                if v.shape[1] != 2 * f:  # stored [E, D, 2F]
                    v = v.transpose(1, 2)
                assert tuple(v.shape) == (n_exp, 2 * f, d), (k, tuple(v.shape))
                for e in range(n_exp):
                    out[f"{base}.experts.{e}.{names[0]}.weight"] = v[e, :f].contiguous()
                    out[f"{base}.experts.{e}.{names[1]}.weight"] = v[e, f:].contiguous()
            else:
                if v.shape[1] != d:  # stored [E, F, D]
                    v = v.transpose(1, 2)
                assert tuple(v.shape) == (n_exp, d, f), (k, tuple(v.shape))
                for e in range(n_exp):
                    out[f"{base}.experts.{e}.{names[2]}.weight"] = v[e].contiguous()
            continue
        if leaf and leaf.endswith("_bias"):
            raise SystemExit(f"unexpected expert bias {k}")
        out[k] = v
    return out


def save_moe(model, d, mixtral):
    from safetensors.torch import save_file
    os.makedirs(d, exist_ok=True)
    model.config.architectures = [type(model).__name__]  # what the model's save_pretrained records
    model.config.save_pretrained(d)
    sd = hub_state_dict(model, mixtral)
    if model.config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    save_file(sd, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})


def models():
    return {
        "llama_gqa": (LlamaForCausalLM, LlamaConfig(**common(**rope_kw(10000.0)))),
        "llama_tied_rope3": (LlamaForCausalLM, LlamaConfig(**common(
            num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True,
            **rope_kw(500000.0, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 64})))),
        "qwen2_bias": (Qwen2ForCausalLM, Qwen2Config(**common(num_key_value_heads=1, rms_norm_eps=1e-6,
                                                             tie_word_embeddings=False,
                                                             **rope_kw(1000000.0)))),
        "mistral": (MistralForCausalLM, MistralConfig(**common(sliding_window=None, head_dim=32,
                                                              **rope_kw(10000.0)))),
    }


def randomize(model, seed):
    """Weights with enough spread that greedy decisions are not near-ties; norms and biases non-trivial."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]) * 1.5)


def round_f16(w):
    return w.to(torch.float16).to(torch.float32)


def round_bf16(w):
    return w.to(torch.bfloat16).to(torch.float32)


def round_q8_0(w):
    """llama.cpp's quantize_row_q8_0_ref then dequantisation, per row in blocks of 32."""
    rows, cols = w.shape
    assert cols % 32 == 0
    b = w.reshape(rows, cols // 32, 32).to(torch.float32)
    amax = b.abs().amax(dim=-1, keepdim=True)
    d = amax / 127.0
    idv = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
    x = b * idv
    q = torch.sign(x) * torch.floor(x.abs() + 0.5)  # roundf: half away from zero
    d16 = d.to(torch.float16).to(torch.float32)
    return (q * d16).reshape(rows, cols)


@torch.no_grad()
def prompt_logits(model, ids):
    return model(torch.tensor([ids])).logits[0].to(torch.float32)


@torch.no_grad()
def greedy(model, ids, n):
    seq = list(ids)
    margins = []
    for _ in range(n):
        logits = model(torch.tensor([seq])).logits[0, -1].to(torch.float64)
        top2 = torch.topk(logits, 2).values
        margins.append(float(top2[0] - top2[1]))
        seq.append(int(torch.argmax(logits)))
    return seq[len(ids):], margins


def rounded_copy(model, fn, moe_kind=None):
    """A copy with every 2-D weight matrix rounded by fn. MoE models (moe_kind "mixtral" or "qwen"): the
    Hub-layout state dict's matrices (each expert's [rows, cols] in its own tensor; not the routers) are
    rounded, saved and loaded back, whatever layout this transformers version keeps the experts in."""
    if moe_kind is not None:
        import tempfile
        from safetensors.torch import save_file
        # the routers (mlp.gate / block_sparse_moe.gate) and the shared expert's gate stay F32, as in the
        # GGUF files (ultra convert and llama.cpp's converter keep them F32)
        kept = (".gate.weight", "shared_expert_gate.weight")
        sd = {k: (fn(v) if v.dim() == 2 and not k.endswith(kept) else v)
              for k, v in hub_state_dict(model, moe_kind == "mixtral").items()}
        with tempfile.TemporaryDirectory() as td:
            model.config.save_pretrained(td)
            save_file(sd, os.path.join(td, "model.safetensors"), metadata={"format": "pt"})
            return type(model).from_pretrained(td, attn_implementation="eager").eval()
    m = type(model)(model.config)
    m.load_state_dict(model.state_dict())
    m.eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() == 2:
                p.copy_(fn(p))
    return m


def save_logits(path, t):
    t.contiguous().numpy().astype("<f4").tofile(path)


def write_v4_config(d, model_cls):
    """Rewrite config.json in the transformers-4 form and check that it loads to the same logits."""
    path = os.path.join(d, "config.json")
    cfg = json.load(open(path))
    rp = cfg.pop("rope_parameters", None)
    if rp is None:
        return False
    cfg["rope_theta"] = rp.get("rope_theta", 10000.0)
    scaling = {k: v for k, v in rp.items() if k != "rope_theta"}
    cfg["rope_scaling"] = None if scaling.get("rope_type", "default") == "default" else scaling
    json.dump(cfg, open(path, "w"), indent=2)
    return True


def check_window_applies(cls, model, ids, ref):
    """The saved logits must be windowed: the first SWA_WINDOW positions equal the same weights' without a
    window, the later ones differ (a transformers version that ignored the key would write a fixture that
    cannot tell a windowed engine from an unwindowed one)."""
    cfg = type(model.config).from_dict(model.config.to_dict())
    cfg.sliding_window = None
    full = cls(cfg).eval()
    full.load_state_dict(model.state_dict())
    f = prompt_logits(full, ids)
    assert torch.allclose(f[:SWA_WINDOW], ref[:SWA_WINDOW], atol=1e-5), "windowed logits differ before the window"
    assert (f[SWA_WINDOW:] - ref[SWA_WINDOW:]).abs().max() > 1e-3, "the sliding window changed nothing"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-o", "--out", default="tests/fixtures/hf")
    ap.add_argument("--only", default="", help="comma-separated fixture names to (re)write; default: all")
    args = ap.parse_args()
    only = set(filter(None, args.only.split(",")))
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    os.makedirs(args.out, exist_ok=True)
    g = torch.Generator().manual_seed(1234)
    prompt = [int(x) for x in torch.randint(3, VOCAB, (N_PROMPT,), generator=g)]
    long_prompts = {n: [int(x) for x in torch.randint(3, VOCAB, (k,), generator=g)]
                    for n, k in LONG_PROMPT.items()}
    summary = {}
    all_models = models()
    all_models.update(new_models())
    for seed, (name, (cls, cfg)) in enumerate(all_models.items()):
        if only and name not in only:
            continue
        prompt_of = long_prompts.get(name, prompt)
        model = cls(cfg).eval()
        randomize(model, 100 + seed)
        d = os.path.join(args.out, name)
        shutil.rmtree(d, ignore_errors=True)
        if name in MOE_FIXTURES:
            save_moe(model, d, name == "mixtral")
        else:
            model.save_pretrained(d, safe_serialization=True)
        ref = prompt_logits(model, prompt_of)
        # Reload from disk: the reference must be what the saved files compute.
        model = cls.from_pretrained(d, attn_implementation="eager").eval()
        assert torch.equal(prompt_logits(model, prompt_of), ref)
        if name == "llama_gqa" and write_v4_config(d, cls):
            m4 = cls.from_pretrained(d, attn_implementation="eager").eval()
            assert torch.equal(prompt_logits(m4, prompt_of), ref), "transformers-4 config form changed the logits"
        if name == "mistral_swa":
            check_window_applies(cls, model, prompt_of, ref)
        save_logits(os.path.join(d, "logits_f32.bin"), ref)
        gen, margins = greedy(model, prompt_of, N_GREEDY)
        info = {"prompt": prompt_of, "greedy": gen, "greedy_min_margin": min(margins), "n_vocab": VOCAB,
                "n_prompt": len(prompt_of), "transformers": transformers.__version__, "torch": torch.__version__,
                "architecture": cfg.architectures[0] if cfg.architectures else cls.__name__}
        for tag, fn in (("f16w", round_f16), ("bf16w", round_bf16), ("q8_0w", round_q8_0)):
            rm = rounded_copy(model, fn, None if name not in MOE_FIXTURES else
                              ("mixtral" if name == "mixtral" else "qwen"))
            save_logits(os.path.join(d, f"logits_{tag}.bin"), prompt_logits(rm, prompt_of))
            info[f"greedy_{tag}"], _ = greedy(rm, prompt_of, N_GREEDY)
        json.dump(info, open(os.path.join(d, "reference.json"), "w"), indent=1)
        summary[name] = {"greedy_min_margin": info["greedy_min_margin"]}
        if name == "llama_gqa":
            db = os.path.join(args.out, name + "_bf16")
            shutil.rmtree(db, ignore_errors=True)
            mb = cls.from_pretrained(d, attn_implementation="eager").to(torch.bfloat16)
            mb.save_pretrained(db, safe_serialization=True)
            mf = cls.from_pretrained(db, attn_implementation="eager", dtype=torch.float32).eval()
            save_logits(os.path.join(db, "logits_f32.bin"), prompt_logits(mf, prompt))
            gb, mg = greedy(mf, prompt, N_GREEDY)
            json.dump({"prompt": prompt, "greedy": gb, "greedy_min_margin": min(mg), "n_vocab": VOCAB,
                       "n_prompt": N_PROMPT, "note": "all tensors BF16 on disk; logits computed in float32"},
                      open(os.path.join(db, "reference.json"), "w"), indent=1)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
