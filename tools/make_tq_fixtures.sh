#!/usr/bin/env bash
# Makes tests/fixtures/lowbit/tq_ref.bin from llama.cpp's own reference code: extracts
# quantize_row_tq{1,2}_0_ref and dequantize_row_tq{1,2}_0 from ggml/src/ggml-quants.c of a llama.cpp
# checkout, compiles them with tools/tq_fixture_main.c (ggml's headers give the block structs and the
# fp16 conversion), and runs the result.
#
#   git clone bench/node_modules/node-llama-cpp/llama/gitRelease.bundle /tmp/llama-src   (after npm install in bench/)
#   tools/make_tq_fixtures.sh /tmp/llama-src
set -euo pipefail
src=${1:?usage: make_tq_fixtures.sh LLAMA_CPP_DIR}
here=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
q=$src/ggml/src/ggml-quants.c
for fn in quantize_row_tq1_0_ref quantize_row_tq2_0_ref dequantize_row_tq1_0 dequantize_row_tq2_0; do
  # from the definition's first line to the first line that is a lone "}"
  awk -v f="void $fn(" 'index($0, f) == 1 { on = 1 } on { print } on && /^}/ { exit }' "$q" >> "$work/tq_ref.c"
done
grep -q dequantize_row_tq2_0 "$work/tq_ref.c"
cc -O1 -std=c11 -I "$src/ggml/include" -I "$src/ggml/src" -include "$here/tools/tq_fixture_shim.h" \
  "$work/tq_ref.c" "$here/tools/tq_fixture_main.c" -lm -o "$work/tq_fixture"
(cd "$src" && git log -1 --format='llama.cpp %H %cs') > "$work/version.txt" 2>/dev/null || echo "llama.cpp (unknown version)" > "$work/version.txt"
"$work/tq_fixture" "$here/tests/fixtures/lowbit/tq_ref.bin"
echo "wrote tests/fixtures/lowbit/tq_ref.bin from $(cat "$work/version.txt")"
