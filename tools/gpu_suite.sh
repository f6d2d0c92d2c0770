#!/usr/bin/env bash
# Builds and runs the CUDA kernel test program and benchmark on a GPU machine (Hopper), from the repo root;
# prints a short summary table last. test_cuda_ops (the op table of tests/op_cases.h on the CUDA kernels
# against the CPU's scalar references) runs too where it was built: it links the library, so --cmake or
# --build-dir only (the nvcc-only build cannot make it).
#
#   tools/gpu_suite.sh [--nvcc | --cmake] [--build-dir DIR] [--out DIR] [--quick] [--no-bench] [--sweep] [--seed N]
#
#   --nvcc       (default) compile src/backend/cuda/*.cu and the two programs with nvcc alone: needs only the
#                CUDA toolkit (nvcc, cuBLASLt), not the Debian packages of the rest of the repo
#   --cmake      cmake -G Ninja -DCMAKE_BUILD_TYPE=Release -DULTRA_CUDA=ON, build the three targets (needs the
#                repo's dependencies: fmt, nlohmann-json, CLI11, pcre2, gtest)
#   --build-dir  use the programs already built in DIR (no build)
#   --out DIR    logs and result files (default: $OUT when set, else /tmp/ultra-gpu-suite)
#   --quick      fewer shapes in the test and the benchmark
#   --no-bench   run the test only
#   --sweep      benchmark variants too (bench_cuda_kernels --sweep: gemv kernels and knobs, PDL on / off)
# Exit status: the test programs' (0 pass, 1 a failure in either, 77 no device), or 2 when the build failed.
set -uo pipefail
cd "$(dirname "$0")/.."

mode=nvcc
build_dir=""
out_dir="${OUT:-/tmp/ultra-gpu-suite}"
quick=()
sweep=()
bench=1
seed=1234
while [ $# -gt 0 ]; do
  case "$1" in
    --nvcc) mode=nvcc ;;
    --cmake) mode=cmake ;;
    --build-dir) build_dir="$2"; mode=prebuilt; shift ;;
    --out) out_dir="$2"; shift ;;
    --quick) quick=(--quick) ;;
    --no-bench) bench=0 ;;
    --sweep) sweep=(--sweep) ;;
    --seed) seed="$2"; shift ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$out_dir"
log() { echo "== $*"; }

nvcc_bin="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
gencode="-gencode=arch=compute_90a,code=sm_90a"
build_status="prebuilt"
t0=$(date +%s)

if [ "$mode" = nvcc ]; then
  build_dir="${build_dir:-build-gpu-nvcc}"
  mkdir -p "$build_dir/obj"
  log "build (nvcc: $nvcc_bin) into $build_dir"
  "$nvcc_bin" --version | tail -2
  # cuBLASLt: the toolkit's, else the one of a pip 'nvidia-cublas' package
  cuda_root="$(dirname "$(dirname "$(readlink -f "$nvcc_bin")")")"
  extra_inc=()
  extra_lib=()
  if ! ls "$cuda_root"/lib64/libcublasLt.so* >/dev/null 2>&1 && ! ls "$cuda_root"/targets/*/lib/libcublasLt.so* >/dev/null 2>&1; then
    pipdir="$(python3 -c 'import nvidia.cublas, os; print(os.path.dirname(nvidia.cublas.__file__))' 2>/dev/null || true)"
    if [ -n "$pipdir" ]; then
      echo "   cuBLASLt from $pipdir"
      extra_inc=(-I"$pipdir/include")
      extra_lib=(-L"$pipdir/lib" -Xlinker -rpath -Xlinker "$pipdir/lib")
      if [ ! -e "$pipdir/lib/libcublasLt.so" ]; then  # pip ships only the versioned name
        ln -sf "$(ls "$pipdir"/lib/libcublasLt.so.* | head -1)" "$build_dir/obj/libcublasLt.so"
        extra_lib+=(-L"$build_dir/obj")
      fi
    fi
  fi
  flags=($gencode -std=c++17 -O3 -lineinfo -Isrc "${extra_inc[@]}")
  pids=()
  : > "$out_dir/ptxas.txt"
  for src in src/backend/cuda/*.cu tests/gpu/test_cuda_kernels.cu bench/bench_cuda_kernels.cu; do
    obj="$build_dir/obj/$(basename "${src%.cu}").o"
    ( "$nvcc_bin" "${flags[@]}" -Xptxas -v -c "$src" -o "$obj" > "$obj.log" 2>&1 || { echo "FAILED: $src"; cat "$obj.log"; exit 1; } ) &
    pids+=($!)
  done
  ok=1
  for p in "${pids[@]}"; do wait "$p" || ok=0; done
  cat "$build_dir"/obj/*.log >> "$out_dir/ptxas.txt" 2>/dev/null
  if [ $ok = 1 ]; then
    kobjs=("$build_dir"/obj/{attention,elementwise,gemm,gemv,rope_kv,sampler}.o)
    "$nvcc_bin" $gencode -o "$build_dir/test_cuda_kernels" "$build_dir/obj/test_cuda_kernels.o" "${kobjs[@]}" "${extra_lib[@]}" -lcublasLt &&
      "$nvcc_bin" $gencode -o "$build_dir/bench_cuda_kernels" "$build_dir/obj/bench_cuda_kernels.o" "${kobjs[@]}" "${extra_lib[@]}" -lcublasLt ||
      ok=0
  fi
  if [ $ok != 1 ]; then
    echo "== summary"; echo "build: FAILED (nvcc), see above"; exit 2
  fi
  build_status="nvcc, $(( $(date +%s) - t0 )) s"
elif [ "$mode" = cmake ]; then
  build_dir="${build_dir:-build-gpu}"
  log "build (cmake, Release, ULTRA_CUDA=ON) into $build_dir"
  if ! cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DULTRA_CUDA=ON -DULTRA_TESTS=ON > "$out_dir/cmake.log" 2>&1 ||
     ! cmake --build "$build_dir" --target test_cuda_kernels bench_cuda_kernels test_cuda_ops >> "$out_dir/cmake.log" 2>&1; then
    tail -40 "$out_dir/cmake.log"
    echo "== summary"; echo "build: FAILED (cmake; on a machine without the repo's Debian packages use --nvcc)"; exit 2
  fi
  build_status="cmake, $(( $(date +%s) - t0 )) s"
fi

test_bin="$build_dir/test_cuda_kernels"
bench_bin="$build_dir/bench_cuda_kernels"
[ -x "$test_bin" ] || test_bin="$build_dir/tests/gpu/test_cuda_kernels"

log "nvidia-smi"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1 | head -3

if command -v cuobjdump >/dev/null 2>&1 && [ -f "$build_dir/obj/gemv.o" ]; then
  cuobjdump --dump-sass "$build_dir/obj/gemv.o" > "$out_dir/gemv.sass" 2>&1 || true
  cuobjdump --dump-sass "$build_dir/obj/attention.o" > "$out_dir/attention.sass" 2>&1 || true
fi

log "test: $test_bin --seed $seed ${quick[*]}"
"$test_bin" --out "$out_dir" --seed "$seed" "${quick[@]}" > "$out_dir/test.log" 2>&1
test_rc=$?
grep -E '^(FAIL|SKIPPED|device)' "$out_dir/test.log" | head -60
tail -1 "$out_dir/test.log"

ops_bin="$build_dir/test_cuda_ops"
[ -x "$ops_bin" ] || ops_bin="$build_dir/tests/gpu/test_cuda_ops"
ops_rc=skipped
: > "$out_dir/test_cuda_ops.log"
if [ -x "$ops_bin" ]; then
  log "op table: $ops_bin"
  "$ops_bin" --out "$out_dir" > "$out_dir/test_cuda_ops.log" 2>&1
  ops_rc=$?
  grep -E '^(FAIL|SKIPPED)' "$out_dir/test_cuda_ops.log" | head -40
  sed -n '/^op  /,$p' "$out_dir/test_cuda_ops.log"
  # a failure of either program fails the suite (no device: 77 from both)
  if [ "$ops_rc" -ne 0 ] && [ "$test_rc" -eq 0 ]; then test_rc=$ops_rc; fi
  if [ "$ops_rc" -ne 0 ] && [ "$ops_rc" -ne 77 ] && [ "$test_rc" -eq 77 ]; then test_rc=1; fi
else
  echo "test_cuda_ops: not built (it links the library: tools/gpu_suite.sh --cmake, or --build-dir of a CMake build)" |
    tee "$out_dir/test_cuda_ops.log"
fi

bench_rc=skipped
if [ $bench = 1 ] && [ $test_rc -ne 77 ]; then
  log "benchmark: $bench_bin ${quick[*]} ${sweep[*]}"
  "$bench_bin" --out "$out_dir" "${quick[@]}" "${sweep[@]}" > "$out_dir/bench.log" 2>&1
  bench_rc=$?
  sed -n '/^ceilings/,/^summary/p' "$out_dir/bench.log"
fi

echo
echo "== summary ($(date -u +%Y-%m-%dT%H:%MZ))"
printf '%-10s %s\n' "build" "$build_status"
printf '%-10s %s (exit %s)\n' "test" "$(tail -1 "$out_dir/test.log")" "$test_rc"
printf '%-10s %s (exit %s)\n' "op table" "$(tail -1 "$out_dir/test_cuda_ops.log")" "$ops_rc"
n_fail=$(grep -c '^FAIL' "$out_dir/test.log" || true)
if [ "$n_fail" != 0 ]; then
  echo "failures by kernel:"
  grep '^FAIL' "$out_dir/test.log" | awk '{print $2}' | sort | uniq -c | sed 's/^/  /'
fi
if grep -q '^FAIL' "$out_dir/test_cuda_ops.log"; then
  echo "op table failures by op:"
  sed -n '/^op  /,$p' "$out_dir/test_cuda_ops.log" | awk 'NR > 1 && $1 != "test_cuda_ops:" && $3 > 0 {print "  " $1 ": " $3 " failed"}'
fi
if [ -f "$out_dir/gemv.sass" ]; then
  printf '%-10s gemv.o: %s HMMA, %s LDG.128; spills: %s\n' "sass" \
    "$(grep -c 'HMMA' "$out_dir/gemv.sass")" "$(grep -cE 'LDG\.E\.(EF\.)?(NA\.)?(LTC[0-9]+B\.)?128' "$out_dir/gemv.sass")" \
    "$(grep -h 'spill' "$out_dir/ptxas.txt" | grep -vc ' 0 bytes spill stores' || true)"
fi
if [ "$bench_rc" != skipped ]; then
  printf '%-10s exit %s\n' "bench" "$bench_rc"
  sed -n '/^summary/,$p' "$out_dir/bench.log" | tail -n +2
fi
echo "logs: $out_dir"
exit $test_rc
