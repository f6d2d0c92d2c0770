#!/usr/bin/env bash
# Packs the GPU test and benchmark binaries of build/ (and bench_matmul and test_cpu_ops, which
# tools/device_cpu_compare.sh runs there too) with the shared libraries they need that a bare GPU machine
# lacks (everything ldd resolves outside libc / libstdc++ / CUDA), into .devpack/bin.tar.xz, which a device call carries
# (`carry: [".devpack"]`) and unpacks with `tar xJf .devpack/bin.tar.xz` before
# `export LD_LIBRARY_PATH=$PWD/.devlibs:/usr/local/cuda/lib64` (tools/gpu_run_all.sh does the export).
# test_nccl_comm (the NCCL transport; forks its ranks, no mpirun there) needs libnccl.so.2, which is not packed
# (218 MB): the GPU machine's PyTorch has one (pip's nvidia-nccl-cu13): add the directory of
# `python3 -c "import glob, site; print(*glob.glob(site.getsitepackages()[0] + '/nvidia/**/libnccl.so.2', recursive=True))"`
# to LD_LIBRARY_PATH.
#   tools/pack_devbin.sh [BUILD_DIR [PROGRAM ...]]
# With PROGRAMs, only those (each GPU program is ~25 MB before packing: the whole list packs to ~20 MB
# and more, which with the repository's tracked files passes the device call's 64 MiB; see
# tools/device_tree.sh for leaving fixtures a call does not read out of the copied tree).
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
shift || true
programs=("$@")
if [ ${#programs[@]} -eq 0 ]; then
  programs=(ultra test_cuda_backend test_cuda_kernels test_cuda_ops test_cuda_moe test_cuda_size_plan bench_cuda_kernels
            bench_server bench_matmul test_cpu_ops test_backend_ops test_zero_alloc test_nccl_comm)
fi
rm -rf .devbin .devlibs
mkdir -p .devbin .devlibs .devpack
for b in "${programs[@]}"; do
  if [ -x "$build/$b" ]; then
    cp "$build/$b" .devbin/
  elif [ $# -gt 0 ]; then
    echo "pack_devbin: $build/$b is not built" >&2
    exit 1
  fi
done
strip .devbin/*
ldd .devbin/* | awk '/=> \// {print $3}' | sort -u |
  grep -vE '/(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so|/cuda' |
  while read -r lib; do cp -L "$lib" .devlibs/; done || true  # (grep finds none: nothing to copy)
# One dictionary over all the programs: their device code is largely the same bytes (six GPU programs pack
# to 12.7 MB this way; with -9's 64 MiB dictionary three took 12 MB).
tar cf - .devbin .devlibs | xz -9e -T1 --lzma2=dict=192MiB > .devpack/bin.tar.xz
echo "$(ls .devbin | wc -l) binaries, $(ls .devlibs | wc -l) libraries: $(du -h .devpack/bin.tar.xz | cut -f1) in .devpack/bin.tar.xz"
