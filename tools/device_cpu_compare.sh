#!/usr/bin/env bash
# The CPU checks and the llama.cpp comparison on the GPU machine's host CPU (16 cores with AVX512-VNNI and
# AMX, which this development machine lacks), in one device call from the repo root:
#   1. test_cpu_ops (the VNNI kernel tests skip elsewhere),
#   2. the Q8_0 int8-activation path (the default there) end to end: the bundled model quantised to Q8_0,
#      96 greedy tokens with it and with ULTRA_Q8_INT8=0 (f32 activations), the tokens compared and the
#      largest logit difference; test_zero_alloc (its Q8_0 case runs both paths),
#   3. bench/cpu_compare.py against llama.cpp built there natively, per thread count and type, and for Q8_0
#      also with ULTRA_Q8_INT8=0 (skipped when THREADS is "none" or llama.cpp's source is not carried).
# The machine is bare and has no access outside: pack here, carry .devpack:
#   tools/pack_devbin.sh   # ultra, bench_matmul, test_cpu_ops, test_zero_alloc (+ GPU programs) -> .devpack/bin.tar.xz
#   tar -C ~/.cache/ultra/llama.cpp-native/src --exclude=.git --exclude=./docs --exclude=./models \
#       --exclude=./media --exclude=./tools/ui/src --exclude=./tools/ui/tests --exclude=./tools/server/public \
#       --exclude=./benches --exclude=./gguf-py --exclude=./tests -cf - . | xz -9 > .devpack/llama-src.tar.xz
#   (llama.cpp's source, ~6 MB: its 35 MB bundle does not fit the 64 MiB carry beside the repo)
# then, on the device: `tar xJf .devpack/bin.tar.xz && tools/device_cpu_compare.sh [THREADS] [TYPES]`
# (defaults "4 8 16" and "q8_0"; THREADS "none": the checks only).
set -uo pipefail
cd "$(dirname "$0")/.."
threads="${1:-4 8 16}"
types="${2:-q8_0}"
export LD_LIBRARY_PATH=$PWD/.devlibs:/usr/local/cuda/lib64
# The test programs find their fixtures under the source directory they were built from: link it here.
built_from="${ULTRA_BUILT_FROM:-/work/main}"
if [ "$built_from" != "$PWD" ] && [ ! -e "$built_from" ]; then
  mkdir -p "$(dirname "$built_from")" && ln -s "$PWD" "$built_from"
fi
grep -o -w -E 'avx512_vnni|avx512_bf16|amx_int8' /proc/cpuinfo | sort -u | tr '\n' ' '
echo "$(nproc) cores"
.devbin/test_cpu_ops 2>&1 | grep -E "Q8_0Int8|PASSED|FAILED|Failure" | head -30
if [ -x .devbin/test_zero_alloc ]; then
  .devbin/test_zero_alloc 2>&1 | grep -E "zero-alloc\]|PASSED|FAILED|Failure" | head -20
fi

.devbin/ultra quantize --type q8_0 models/target.gguf /tmp/t8.gguf > /dev/null || echo "quantize failed"
prompt="Once upon a time, a little fox found a shiny key in the forest. She"
for e in 0 1; do  # 0: f32 activations, 1: int8 (the default on VNNI CPUs)
  ULTRA_Q8_INT8=$e .devbin/ultra run -m /tmp/t8.gguf -p "$prompt" -n 96 --temp 0 --json -t 4 \
    --dump-logits /tmp/logits$e.bin > /tmp/run$e.json
done
python3 - <<'PY'
import json, numpy as np
g0, g1 = (json.load(open(f'/tmp/run{e}.json'))['generated_ids'] for e in (0, 1))
same = next((i for i, (a, b) in enumerate(zip(g0, g1)) if a != b), min(len(g0), len(g1)))
l0, l1 = (np.fromfile(f'/tmp/logits{e}.bin', np.float32) for e in (0, 1))
k = min(same + 1, len(g0)) * (l0.size // len(g0))
print(f"Q8_0 greedy, exact vs int8 activations: {len(g0)} tokens, the first {same} identical; "
      f"max |logit diff| {np.abs(l0[:k] - l1[:k]).max():.4g} (logits {l0[:k].min():.2f} .. {l0[:k].max():.2f})")
PY

src=$HOME/.cache/ultra/llama.cpp-native/src
if [ "$threads" = none ] || { [ ! -d "$src/.git" ] && [ ! -f .devpack/llama-src.tar.xz ]; }; then
  echo "no llama.cpp comparison (THREADS none, or .devpack/llama-src.tar.xz not carried)"
  exit 0
fi
if [ ! -d "$src/.git" ]; then
  mkdir -p "$src" && tar xJf .devpack/llama-src.tar.xz -C "$src" &&
    (cd "$src" && git init -q && git add -A && git -c user.email=a@b -c user.name=b commit -qm src)
fi
for t in $threads; do
  python3 bench/cpu_compare.py --build .devbin --threads "$t" --prompt 512 --gen 128 --reps 3 --types "$types" |
    grep -E '^\||read bandwidth'
  case ",$types," in *,q8_0,*)
    python3 bench/cpu_compare.py --build .devbin --threads "$t" --prompt 512 --gen 128 --reps 3 --types q8_0 \
      --env ULTRA_Q8_INT8=0 | grep -E '^\| q8_0|read bandwidth' | sed 's/^| q8_0 /| q8_0 f32 x /' ;;
  esac
done
