#!/usr/bin/env bash
# Every GPU check and benchmark of the repo, in one call on the GPU machine (from the repo root):
#   1. the kernel test program, the op table on the CUDA kernels (test_cuda_ops: tests/op_cases.h against
#      the CPU's scalar references) and the kernel benchmark (tools/gpu_suite.sh),
#   2. the engine on the CUDA backend (test_cuda_backend: HF fixtures, bundled model vs PyTorch, CPU
#      agreement, zero allocation per step, graph replay and host dispatch),
#   3. ultra vs PyTorch decode/prefill on Llama-shaped random BF16 models (bench/cuda_compare.py).
# The GPU machine is bare (no Debian packages): build here and carry the binaries with the libraries they
# need: `tools/pack_devbin.sh` (-> .devpack/bin.tar.xz, ~5 MB), then, with .devpack carried:
# `tar xJf .devpack/bin.tar.xz && tools/gpu_run_all.sh`. bench/decode_ab.py A/Bs the decode step's launch
# modes and fusions (and, with --skip-sets, what each op costs inside the graph).
#
#   tools/gpu_run_all.sh [--bin DIR] [--quick] [--no-kernels] [--no-bench] [--shapes 1b,8b]
set -uo pipefail
cd "$(dirname "$0")/.."
bin=.devbin
quick=()
bench=1
kernels=1
shapes=1b,8b
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin="$2"; shift ;;
    --quick) quick=(--quick) ;;
    --no-bench) bench=0 ;;
    --no-kernels) kernels=0 ;;
    --shapes) shapes="$2"; shift ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
  shift
done
out="${OUT:-/tmp/ultra-gpu}"
mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/.devlibs:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
# The test programs find their fixtures under the source directory they were built from (ULTRA_SOURCE_DIR,
# /work/main on the development machine): link it to this checkout.
src="${ULTRA_BUILT_FROM:-/work/main}"
if [ "$src" != "$PWD" ] && [ ! -e "$src" ]; then mkdir -p "$(dirname "$src")" && ln -s "$PWD" "$src"; fi
status=0

if [ "$kernels" = 1 ]; then
  echo "== 1. kernels"
  tools/gpu_suite.sh --build-dir "$bin" --out "$out" "${quick[@]}" || status=1
fi
if [ "$kernels" = 1 ]; then
  echo "== 1b. mixture-of-experts kernels"
  "$bin/test_cuda_moe" --out "$out" >"$out/test_cuda_moe.log" 2>&1 || status=1
  grep -E "^FAIL|test_cuda_moe:" "$out/test_cuda_moe.log"
fi
echo "== 2. engine on the CUDA backend"
"$bin/test_cuda_backend" 2>&1 | tee "$out/test_cuda_backend.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
if [ "$bench" = 1 ]; then
  echo "== 3. ultra vs PyTorch"
  PYTHONUNBUFFERED=1 python3 bench/cuda_compare.py --ultra "$bin/ultra" --shapes "$shapes" --profile --out "$out" 2>&1 |
    tee "$out/cuda_compare.log" || status=1
fi
echo "== summary"
grep -h "test_cuda_kernels:" "$out/test.log" 2>/dev/null | tail -1
grep -h "test_cuda_ops" "$out/test_cuda_ops.log" 2>/dev/null | tail -1
grep -h "test_cuda_moe:" "$out/test_cuda_moe.txt" 2>/dev/null | tail -1
grep -hE "^\[  (PASSED|FAILED)|tests? ran" "$out/test_cuda_backend.log" | tail -3
exit $status
