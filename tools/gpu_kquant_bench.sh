#!/usr/bin/env bash
# The GGUF block types end to end on the GPU machine, in one call (from the repo root, .devpack unpacked):
# a Llama-3-8B-shaped model with --layers layers (random F16 weights, tools/make_bench_gguf.py), quantised
# by `ultra quantize` to Q4_K_M, then `ultra bench --device cuda` decode (tg) and prefill (pp)
# for F16, Q4_K_M with f32 activations (ULTRA_CUDA_KQ_INT8=0), Q4_K_M with int8 activations
# (ULTRA_CUDA_KQ_INT8=1), then the f32 path again.
#   tools/gpu_kquant_bench.sh [--bin DIR] [--layers N] [--out DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
bin=.devbin
layers=8
out="${OUT:-/tmp/ultra-gpu}"
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin="$2"; shift ;;
    --layers) layers="$2"; shift ;;
    --out) out="$2"; shift ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/.devlibs:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
dir=/tmp/ultra-kq
mkdir -p "$dir"
f16="$dir/llama8b-${layers}l-f16.gguf"
[ -f "$f16" ] || python3 tools/make_bench_gguf.py --arch llama --type f16 --dim 4096 --layers "$layers" \
  --heads 32 --kv-heads 8 --ffn 14336 --vocab 128256 -o "$f16" || exit 1
for t in q4_k_m; do
  [ -f "$dir/${t}.gguf" ] || "$bin/ultra" quantize "$f16" "$dir/${t}.gguf" --type "$t" >/dev/null || exit 1
done
ls -la "$dir"
bench() {  # label, env, model
  echo "== $1"
  env $2 "$bin/ultra" bench --device cuda -m "$3" -p 512 -n 128 -r 2 2>&1 | grep -E "^\||tok/s" | tail -3
}
{
  bench "F16" "ULTRA_CUDA_KQ_INT8=0" "$f16"
  bench "Q4_K_M, f32 x" "ULTRA_CUDA_KQ_INT8=0" "$dir/q4_k_m.gguf"
  bench "Q4_K_M, int8 x" "ULTRA_CUDA_KQ_INT8=1" "$dir/q4_k_m.gguf"
  bench "Q4_K_M, f32 x (again)" "ULTRA_CUDA_KQ_INT8=0" "$dir/q4_k_m.gguf"
} 2>&1 | tee "$out/gpu_kquant_bench.txt"
