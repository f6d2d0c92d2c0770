#!/usr/bin/env python3
"""Write a random-weight Llama, Qwen3, Gemma-3 or mixture-of-experts GGUF (v3) file for speed benchmarks.

Pure Python standard library (struct, array, random); no numpy.

The file follows llama.cpp's conventions (key names and types as written by
convert_hf_to_gguf.py, ggml tensor names, ne[0] = number of columns), so both
ultra and llama.cpp (e.g. through node-llama-cpp) load it:

    python3 tools/make_bench_gguf.py --type q8_0 -o /tmp/ultra-bench/llama110m-q8_0.gguf
    python3 tools/make_bench_gguf.py --arch qwen3 --type f16 -o /tmp/ultra-bench/qwen3-110m-f16.gguf
    python3 tools/make_bench_gguf.py --arch gemma3 --type f16 -o /tmp/ultra-bench/gemma3-110m-f16.gguf
    python3 tools/make_bench_gguf.py --type fp8 -o /tmp/ultra-bench/llama110m-fp8.gguf

--type fp8 and ternary are ultra's own types (docs/QUANTIZATION.md; llama.cpp does not load them): F8_E4M3
codes with an F32 "<name>.scale" of one value per row, or 16 trits per u32 with one scale per tensor.

Shapes (every option below overrides its part of the preset):
  llama   the ~110M-parameter Llama: dim 768, 12 layers, 12 heads, 12 kv heads
          (head_dim 64), ffn 2048, vocab 32000, context 2048, rope base 1e4.
  qwen3   a ~110M Qwen3 shape: dim 768, 12 layers, 8 heads, 4 kv heads,
          head_dim 128 (q width 1024 != dim, as in Qwen3), ffn 2048, vocab 32000,
          rope base 1e6, rms eps 1e-6; per-head RMSNorm weights
          blk.N.attn_q_norm / attn_k_norm [head_dim], no QKV bias, keys qwen3.*.
  gemma3  a ~105M Gemma-3 shape: dim 768, 12 layers, 8 heads, 2 kv heads,
          head_dim 128, ffn 2048 (GeGLU: ffn_gate/ffn_up/ffn_down, the activation
          is implied by the architecture), vocab 32000, tied embeddings (always),
          q/k norms, blk.N.post_attention_norm / post_ffw_norm, sliding window 512
          on 5 of every 6 layers (gemma3.attention.sliding_window_pattern = 6,
          layers 5 and 11 global), rope base 1e6 global / 1e4 local
          (gemma3.rope.freq_base_swa), rms eps 1e-6, keys gemma3.*.
  qwen3moe  a ~1B-parameter Qwen3-MoE shape (~0.3B active): dim 1024, 16 layers,
          16 heads, 4 kv heads, head_dim 128, 8 experts of which 2 are used,
          expert ffn 2048 (qwen3moe.expert_feed_forward_length), vocab 32000,
          rope base 1e6, rms eps 1e-6; q/k norms; the router
          blk.N.ffn_gate_inp [8, dim] and the stacked experts
          blk.N.ffn_{gate,up,down}_exps [8, rows, cols].
  mixtral   the same experts as arch "llama" (Mixtral's layout: expert ffn =
          llama.feed_forward_length), dim 1024, 16 layers, 16 heads, 4 kv heads.
  qwen2moe  qwen3moe's shape without q/k norms, with q/k/v biases and a shared
          expert (expert_shared_feed_forward_length 2048, its sigmoid gate
          blk.N.ffn_gate_inp_shexp [dim]).
Both engines load all of them (llama.cpp's loaders: src/models/qwen3.cpp,
gemma3.cpp, qwen3moe.cpp, qwen2moe.cpp, llama.cpp; ultra's: src/model/load_gguf.cpp).

    python3 tools/make_bench_gguf.py --arch qwen3moe --type q8_0 -o /tmp/ultra-bench/qwen3moe-1b-q8_0.gguf
    ultra quantize /tmp/ultra-bench/qwen3moe-1b-f16.gguf /tmp/ultra-bench/qwen3moe-1b-q4_k_m.gguf --type q4_k_m

RMSNorm weights (every 1-D tensor) are written as 1.0: llama.cpp and ultra
multiply by the stored value as it is, and llama.cpp's converter stores Gemma's
(1 + w) already shifted (conversion/gemma.py, norm_shift), so 1.0 is the
identity norm for every architecture.

The weights are NOT independent samples.  Drawing ~110M gaussians one by one
in pure Python takes minutes, so one pool of POOL_SIZE values ~ N(0, std) is
drawn once and every tensor is filled with chunks copied from random offsets
of that pool (for q8_0 the pool is quantised once and whole 34-byte blocks are
copied).  The values therefore repeat across and within tensors.  That is
irrelevant for a speed benchmark (the arithmetic is the same for any values),
but the model is of course meaningless as a language model.
"""

import argparse
import array
import math
import os
import random
import struct
import sys
import time

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
ALIGNMENT = 32

# gguf metadata value types
T_UINT8, T_INT8, T_UINT16, T_INT16, T_UINT32, T_INT32, T_FLOAT32, T_BOOL, T_STRING, T_ARRAY, T_UINT64, T_INT64, T_FLOAT64 = range(13)

# ggml tensor types (and ultra's own: F8_E4M3, TERNARY)
GGML_F32, GGML_F16, GGML_Q8_0 = 0, 1, 8
ULTRA_F8_E4M3, ULTRA_TERNARY = 0x55540001, 0x55540002
QK8_0 = 32
Q8_0_BLOCK_BYTES = 2 + QK8_0  # f16 scale + 32 int8

# llama_ftype (general.file_type); ultra's types: their type id
FILE_TYPE = {"f32": 0, "f16": 1, "q8_0": 7, "fp8": ULTRA_F8_E4M3, "ternary": ULTRA_TERNARY}
GGML_TYPE = {"f32": GGML_F32, "f16": GGML_F16, "q8_0": GGML_Q8_0, "fp8": ULTRA_F8_E4M3,
             "ternary": ULTRA_TERNARY}

# Preset shapes per --arch (see the docstring); None = derived.
_COMMON = dict(dim=768, layers=12, ffn=2048, vocab=32000, ctx=2048)
PRESETS = {
    "llama": dict(_COMMON, heads=12, kv_heads=None, head_dim=None, rope_theta=10000.0, rms_eps=1e-5),
    "qwen3": dict(_COMMON, heads=8, kv_heads=4, head_dim=128, rope_theta=1000000.0, rms_eps=1e-6),
    "gemma3": dict(_COMMON, heads=8, kv_heads=2, head_dim=128, rope_theta=1000000.0, rms_eps=1e-6,
                   sliding_window=512, swa_pattern=6, rope_theta_swa=10000.0),
}
_MOE = dict(dim=1024, layers=16, ffn=2048, vocab=32000, ctx=4096, heads=16, kv_heads=4, head_dim=128,
            rope_theta=1000000.0, rms_eps=1e-6, experts=8, experts_used=2, shexp_ffn=2048)
PRESETS.update({"qwen3moe": dict(_MOE), "qwen2moe": dict(_MOE), "mixtral": dict(_MOE, head_dim=None, rms_eps=1e-5)})
MOE_ARCHS = ("qwen3moe", "qwen2moe", "mixtral")

# llama_token_type (tokenizer.ggml.token_type)
TOK_NORMAL, TOK_UNKNOWN, TOK_CONTROL, TOK_BYTE = 1, 2, 3, 6

POOL_SIZE = 1 << 20   # values in the random pool (multiple of QK8_0)
CHUNK = 1 << 14       # values copied per random offset (multiple of QK8_0)

if sys.byteorder != "little":
    sys.exit("make_bench_gguf.py: this writer assumes a little-endian host")


# ----------------------------------------------------------------- metadata --

def enc_str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def enc_kv(key, vtype, value, elem_type=None):
    out = [enc_str(key), struct.pack("<I", vtype)]
    if vtype == T_ARRAY:
        out.append(struct.pack("<IQ", elem_type, len(value)))
        if elem_type == T_STRING:
            out.extend(enc_str(v) for v in value)
        elif elem_type == T_FLOAT32:
            out.append(array.array("f", value).tobytes())
        elif elem_type == T_INT32:
            out.append(array.array("i", value).tobytes())
        else:
            raise ValueError("unsupported array element type %d" % elem_type)
    elif vtype == T_STRING:
        out.append(enc_str(value))
    elif vtype == T_UINT32:
        out.append(struct.pack("<I", value))
    elif vtype == T_INT32:
        out.append(struct.pack("<i", value))
    elif vtype == T_FLOAT32:
        out.append(struct.pack("<f", value))
    elif vtype == T_BOOL:
        out.append(struct.pack("<?", value))
    else:
        raise ValueError("unsupported value type %d" % vtype)
    return b"".join(out)


def make_vocab(n_vocab):
    """SentencePiece-style vocabulary: <unk> <s> </s>, 256 byte tokens, fillers."""
    if n_vocab < 3 + 256 + 1:
        raise SystemExit("n_vocab must be at least 260")
    tokens = ["<unk>", "<s>", "</s>"]
    types = [TOK_UNKNOWN, TOK_CONTROL, TOK_CONTROL]
    scores = [0.0, 0.0, 0.0]
    for b in range(256):
        tokens.append("<0x%02X>" % b)
        types.append(TOK_BYTE)
        scores.append(0.0)
    i = 0
    while len(tokens) < n_vocab:
        tokens.append("\u2581t%d" % i)  # "▁t123"
        types.append(TOK_NORMAL)
        scores.append(-float(i + 1))   # decreasing scores, like a real SPM vocab
        i += 1
    assert len(set(tokens)) == len(tokens) == n_vocab
    return tokens, scores, types


# ------------------------------------------------------------------ weights --

def f16_bytes(values):
    return struct.pack("<%de" % len(values), *values)


def _roundf(x):
    """C roundf: halfway cases away from zero (Python's round() rounds half to even)."""
    return int(math.floor(x + 0.5)) if x >= 0 else -int(math.floor(-x + 0.5))


def quantize_q8_0(values):
    """ggml's quantize_row_q8_0_ref: d = amax/127, q = round(x/d), d stored as f16."""
    assert len(values) % QK8_0 == 0
    out = bytearray()
    for i in range(0, len(values), QK8_0):
        blk = values[i:i + QK8_0]
        amax = max(abs(v) for v in blk)
        d = amax / 127.0
        inv = 1.0 / d if d else 0.0
        qs = [_roundf(v * inv) for v in blk]  # |v*inv| <= 127
        out += struct.pack("<e", d)
        out += struct.pack("<32b", *qs)
    return bytes(out)


def fp8_e4m3_value(code):
    """Value of an E4M3 code (core/fp8.h); None for the NaN codes."""
    s, e, m = code >> 7, (code >> 3) & 0xF, code & 7
    if e == 0xF and m == 7:
        return None
    v = m / 8.0 * 2.0 ** -6 if e == 0 else (1 + m / 8.0) * 2.0 ** (e - 7)
    return -v if s else v


def encode_fp8_pool(values):
    """Each value (already divided by its scale) to the nearest E4M3 code (ties: either; saturating)."""
    import bisect
    pos = sorted((fp8_e4m3_value(c), c) for c in range(0x7F))  # 0 .. 448, codes 0x00 .. 0x7E
    keys = [v for v, _ in pos]
    out = bytearray(len(values))
    for i, x in enumerate(values):
        a = min(abs(x), 448.0)
        j = bisect.bisect_left(keys, a)
        if j == len(keys) or (j > 0 and a - keys[j - 1] <= keys[j] - a):
            j -= 1
        out[i] = pos[j][1] | (0x80 if x < 0 else 0)
    return bytes(out)


def ternary_pool(rng, n):
    """n trits (n % 16 == 0), -1 / 0 / +1 equally likely, packed 16 per little-endian u32 (core/ternary.h)."""
    words = array.array("I")
    for _ in range(n // 16):
        w = 0
        for i in range(16):
            w |= (0, 1, 2)[rng.randrange(3)] << (2 * i)
        words.append(w)
    return words.tobytes()


class WeightSource:
    """Produces tensor data of a given ggml type from one shared random pool."""

    def __init__(self, wtype, rng, std):
        self.rng = rng
        pool = array.array("f", (rng.gauss(0.0, std) for _ in range(POOL_SIZE)))
        if wtype == "f32":
            self.pool = pool.tobytes()
            self.bytes_per_unit, self.values_per_unit = 4, 1
        elif wtype == "f16":
            self.pool = f16_bytes(pool)
            self.bytes_per_unit, self.values_per_unit = 2, 1
        elif wtype == "fp8":  # one code per value; the codes of N(0, std) / scale, scale = 4 std / 448
            self.scale = 4.0 * std / 448.0
            self.pool = encode_fp8_pool([v / self.scale for v in pool])
            self.bytes_per_unit, self.values_per_unit = 1, 1
        elif wtype == "ternary":  # one unit = one u32 of 16 trits; scale = std
            self.scale = std
            self.pool = ternary_pool(rng, POOL_SIZE)
            self.bytes_per_unit, self.values_per_unit = 4, 16
        else:  # q8_0: one unit = one 32-value block
            self.pool = quantize_q8_0(pool)
            self.bytes_per_unit, self.values_per_unit = Q8_0_BLOCK_BYTES, QK8_0
        self.pool_units = POOL_SIZE // self.values_per_unit
        self.chunk_units = CHUNK // self.values_per_unit

    def nbytes(self, n_values):
        assert n_values % self.values_per_unit == 0
        return n_values // self.values_per_unit * self.bytes_per_unit

    def write(self, f, n_values):
        units = n_values // self.values_per_unit
        bpu = self.bytes_per_unit
        while units > 0:
            take = min(units, self.chunk_units)
            off = self.rng.randrange(0, self.pool_units - take + 1)
            f.write(self.pool[off * bpu:(off + take) * bpu])
            units -= take


def write_f32_const(f, n, value):
    f.write(array.array("f", [value]).tobytes() * n)


# --------------------------------------------------------------------- main --

def pad_to(n, align=ALIGNMENT):
    return (n + align - 1) // align * align


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", choices=sorted(PRESETS), default="llama", help="architecture and its preset shape")
    ap.add_argument("--type", choices=["f32", "f16", "q8_0", "fp8", "ternary"], default="f32",
                    help="weight type of the 2-D tensors (norms stay F32)")
    ap.add_argument("-o", "--output", required=True, help="output .gguf path")
    ap.add_argument("--dim", type=int)
    ap.add_argument("--layers", type=int)
    ap.add_argument("--heads", type=int)
    ap.add_argument("--kv-heads", type=int, help="default: the preset's (llama: --heads)")
    ap.add_argument("--head-dim", type=int, help="default: the preset's (llama: dim / heads)")
    ap.add_argument("--ffn", type=int)
    ap.add_argument("--vocab", type=int)
    ap.add_argument("--ctx", type=int)
    ap.add_argument("--rope-theta", type=float)
    ap.add_argument("--rms-eps", type=float)
    ap.add_argument("--sliding-window", type=int, help="gemma3: window of the local layers (0: none)")
    ap.add_argument("--swa-pattern", type=int, help="gemma3: every n-th layer is global")
    ap.add_argument("--rope-theta-swa", type=float, help="gemma3: rope base of the local layers")
    ap.add_argument("--experts", type=int, help="MoE: experts per layer")
    ap.add_argument("--experts-used", type=int, help="MoE: experts each token uses")
    ap.add_argument("--shexp-ffn", type=int, help="qwen2moe: the shared expert's ffn size")
    ap.add_argument("--std", type=float, default=0.02, help="std of the random weights")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--tie-embeddings", action="store_true",
                    help="omit output.weight (the output projection then reuses token_embd.weight)")
    args = ap.parse_args()
    preset = args.arch
    for k, v in PRESETS[preset].items():
        if getattr(args, k, None) is None:
            setattr(args, k, v)
    moe = preset in MOE_ARCHS
    if moe and args.type in ("fp8", "ternary"):
        sys.exit("experts: --type f32, f16 or q8_0 (ultra quantize writes the k-quant mixes)")
    arch = "llama" if preset == "mixtral" else preset  # the file's general.architecture
    if arch == "gemma3":
        args.tie_embeddings = True  # Gemma's output projection is the embedding

    dim, n_layers, n_heads, ffn, n_vocab = args.dim, args.layers, args.heads, args.ffn, args.vocab
    n_kv = args.kv_heads or n_heads
    if n_heads % n_kv:
        sys.exit("heads must be divisible by kv-heads")
    if args.head_dim is None and dim % n_heads:
        sys.exit("dim must be divisible by heads (or give --head-dim)")
    head_dim = args.head_dim or dim // n_heads
    q_dim = n_heads * head_dim
    kv_dim = n_kv * head_dim
    if args.type == "q8_0" and (dim % QK8_0 or ffn % QK8_0 or q_dim % QK8_0):
        sys.exit("q8_0 needs dim, ffn and heads * head_dim to be multiples of 32")
    if args.type == "ternary" and (dim % 16 or ffn % 16 or q_dim % 16):
        sys.exit("ternary needs dim, ffn and heads * head_dim to be multiples of 16")

    t0 = time.time()
    rng = random.Random(args.seed)
    wt = GGML_TYPE[args.type]

    # (name, ne (ggml order: ne[0] = columns), ggml type)
    tensors = [("token_embd.weight", [dim, n_vocab], wt)]
    for i in range(n_layers):
        p = "blk.%d." % i
        tensors += [
            (p + "attn_norm.weight", [dim], GGML_F32),
            (p + "attn_q.weight", [dim, q_dim], wt),
            (p + "attn_k.weight", [dim, kv_dim], wt),
            (p + "attn_v.weight", [dim, kv_dim], wt),
            (p + "attn_output.weight", [q_dim, dim], wt),
        ]
        if arch == "qwen2moe":
            tensors += [(p + "attn_q.bias", [q_dim], GGML_F32), (p + "attn_k.bias", [kv_dim], GGML_F32),
                        (p + "attn_v.bias", [kv_dim], GGML_F32)]
        if arch in ("qwen3", "gemma3", "qwen3moe"):
            tensors += [(p + "attn_q_norm.weight", [head_dim], GGML_F32),
                        (p + "attn_k_norm.weight", [head_dim], GGML_F32)]
        if arch == "gemma3":
            tensors.append((p + "post_attention_norm.weight", [dim], GGML_F32))
        if moe:  # the router (in the weight type: both engines read it so), the stacked experts
            ne_ = args.experts
            tensors += [
                (p + "ffn_norm.weight", [dim], GGML_F32),
                (p + "ffn_gate_inp.weight", [dim, ne_], wt),
                (p + "ffn_gate_exps.weight", [dim, ffn, ne_], wt),
                (p + "ffn_up_exps.weight", [dim, ffn, ne_], wt),
                (p + "ffn_down_exps.weight", [ffn, dim, ne_], wt),
            ]
            if arch == "qwen2moe":
                tensors += [
                    (p + "ffn_gate_inp_shexp.weight", [dim], GGML_F32),
                    (p + "ffn_gate_shexp.weight", [dim, args.shexp_ffn], wt),
                    (p + "ffn_up_shexp.weight", [dim, args.shexp_ffn], wt),
                    (p + "ffn_down_shexp.weight", [args.shexp_ffn, dim], wt),
                ]
        else:
            tensors += [
                (p + "ffn_norm.weight", [dim], GGML_F32),
                (p + "ffn_gate.weight", [dim, ffn], wt),
                (p + "ffn_up.weight", [dim, ffn], wt),
                (p + "ffn_down.weight", [ffn, dim], wt),
            ]
        if arch == "gemma3":
            tensors.append((p + "post_ffw_norm.weight", [dim], GGML_F32))
    tensors.append(("output_norm.weight", [dim], GGML_F32))
    if not args.tie_embeddings:
        tensors.append(("output.weight", [dim, n_vocab], wt))
    # ultra's scaled types: an F32 "<base>.scale" per matrix (fp8: [rows], ternary: [1]), constant
    scale_of = {}
    if args.type in ("fp8", "ternary"):
        for name, ne, t in list(tensors):
            if t == wt and len(ne) == 2:
                sname = name[:-len(".weight")] + ".scale"
                scale_of[sname] = True
                tensors.append((sname, [ne[1]] if args.type == "fp8" else [1], GGML_F32))

    tokens, scores, types = make_vocab(n_vocab)
    kvs = [
        enc_kv("general.architecture", T_STRING, arch),
        enc_kv("general.name", T_STRING, "ultra-bench random %s %s" % (arch, args.type)),
        enc_kv("general.alignment", T_UINT32, ALIGNMENT),
        enc_kv("general.file_type", T_UINT32, FILE_TYPE[args.type]),
        enc_kv(arch + ".vocab_size", T_UINT32, n_vocab),
        enc_kv(arch + ".context_length", T_UINT32, args.ctx),
        enc_kv(arch + ".embedding_length", T_UINT32, dim),
        enc_kv(arch + ".block_count", T_UINT32, n_layers),
        enc_kv(arch + ".feed_forward_length", T_UINT32, ffn),
        enc_kv(arch + ".attention.head_count", T_UINT32, n_heads),
        enc_kv(arch + ".attention.head_count_kv", T_UINT32, n_kv),
        enc_kv(arch + ".rope.freq_base", T_FLOAT32, args.rope_theta),
        enc_kv(arch + ".attention.layer_norm_rms_epsilon", T_FLOAT32, args.rms_eps),
        enc_kv(arch + ".rope.dimension_count", T_UINT32, head_dim),
    ]
    if arch != "llama" or head_dim * n_heads != dim:  # (llama files stay as before: dim / heads implied)
        kvs += [enc_kv(arch + ".attention.key_length", T_UINT32, head_dim),
                enc_kv(arch + ".attention.value_length", T_UINT32, head_dim)]
    if moe:
        kvs += [enc_kv(arch + ".expert_count", T_UINT32, args.experts),
                enc_kv(arch + ".expert_used_count", T_UINT32, args.experts_used)]
        if arch != "llama":
            kvs.append(enc_kv(arch + ".expert_feed_forward_length", T_UINT32, ffn))
        if arch == "qwen2moe":
            kvs.append(enc_kv(arch + ".expert_shared_feed_forward_length", T_UINT32, args.shexp_ffn))
    if arch == "gemma3" and args.sliding_window > 0:
        kvs += [
            enc_kv(arch + ".attention.sliding_window", T_UINT32, args.sliding_window),
            enc_kv(arch + ".attention.sliding_window_pattern", T_UINT32, args.swa_pattern),
            enc_kv(arch + ".rope.freq_base_swa", T_FLOAT32, args.rope_theta_swa),
        ]
    kvs += [
        enc_kv("tokenizer.ggml.model", T_STRING, "llama"),
        enc_kv("tokenizer.ggml.tokens", T_ARRAY, tokens, T_STRING),
        enc_kv("tokenizer.ggml.scores", T_ARRAY, scores, T_FLOAT32),
        enc_kv("tokenizer.ggml.token_type", T_ARRAY, types, T_INT32),
        enc_kv("tokenizer.ggml.bos_token_id", T_UINT32, 1),
        enc_kv("tokenizer.ggml.eos_token_id", T_UINT32, 2),
        enc_kv("tokenizer.ggml.unknown_token_id", T_UINT32, 0),
        enc_kv("tokenizer.ggml.add_bos_token", T_BOOL, True),
        enc_kv("tokenizer.ggml.add_eos_token", T_BOOL, False),
    ]

    src = WeightSource(args.type, rng, args.std)

    def nbytes(ne, t):
        n = 1
        for x in ne:
            n *= x
        if t == GGML_F32:
            return 4 * n
        return src.nbytes(n)

    infos = []
    offset = 0
    n_params = 0
    for name, ne, t in tensors:
        offset = pad_to(offset)
        infos.append(enc_str(name) + struct.pack("<I", len(ne)) + struct.pack("<%dQ" % len(ne), *ne)
                     + struct.pack("<IQ", t, offset))
        offset += nbytes(ne, t)
        n = 1
        for x in ne:
            n *= x
        n_params += n

    header = GGUF_MAGIC + struct.pack("<IQQ", GGUF_VERSION, len(tensors), len(kvs))
    head = header + b"".join(kvs) + b"".join(infos)

    out_dir = os.path.dirname(os.path.abspath(args.output))
    os.makedirs(out_dir, exist_ok=True)
    tmp = args.output + ".tmp"
    with open(tmp, "wb", buffering=1 << 22) as f:
        f.write(head)
        f.write(b"\0" * (pad_to(len(head)) - len(head)))
        data_start = f.tell()
        for name, ne, t in tensors:
            pos = f.tell() - data_start
            f.write(b"\0" * (pad_to(pos) - pos))
            n = 1
            for x in ne:
                n *= x
            if name in scale_of:
                write_f32_const(f, n, src.scale)
            elif t == GGML_F32 and len(ne) == 1:
                write_f32_const(f, n, 1.0)  # RMSNorm weights = 1.0
            else:
                src.write(f, n)
        size = f.tell()
    os.replace(tmp, args.output)
    print("wrote %s: %s, %d tensors, %.1fM params, %.1f MB, %.1f s"
          % (args.output, args.type, len(tensors), n_params / 1e6, size / 1e6, time.time() - t0), file=sys.stderr)


if __name__ == "__main__":
    main()
