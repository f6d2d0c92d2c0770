#!/usr/bin/env bash
# Makes tests/fixtures/quants/ggml_ref.bin and ggml_iq_ref.bin with llama.cpp's own ggml
# (tools/quant_fixture_main.c and iq_fixture_main.c say what they hold), and src/core/iq_grids_packed.h.
# Uses the native llama.cpp build of bench/llamacpp_build.py (cloned from node-llama-cpp's bundle and built on
# first use: `cd bench && npm install` first).
#
#   tools/make_quant_fixtures.sh [LLAMA_DIR]   (default ~/.cache/ultra/llama.cpp-native)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
llama=${1:-$HOME/.cache/ultra/llama.cpp-native}
(cd "$here/bench" && python3 -c "
import sys; sys.path.insert(0, '.')
from llamacpp_build import llama_binary
llama_binary('$llama', 'llama-quantize')" >/dev/null)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cc -O1 -std=c11 -I "$llama/src/ggml/include" "$here/tools/quant_fixture_main.c" \
  -L "$llama/build/bin" -lggml-base -Wl,-rpath,"$llama/build/bin" -lm -o "$work/quant_fixture"
out="$here/tests/fixtures/quants/ggml_ref.bin"
mkdir -p "$(dirname "$out")"
"$work/quant_fixture" "$out"
echo "wrote $out ($(stat -c %s "$out") bytes) from llama.cpp $(git -C "$llama/src" rev-parse --short HEAD)"
# The grid i-quants (tools/iq_fixture_main.c), and their grids (src/core/iq_grids_packed.h).
cc -O1 -std=c11 -I "$llama/src/ggml/include" "$here/tools/iq_fixture_main.c" \
  -L "$llama/build/bin" -lggml-base -Wl,-rpath,"$llama/build/bin" -lm -o "$work/iq_fixture"
iq="$here/tests/fixtures/quants/ggml_iq_ref.bin"
"$work/iq_fixture" "$iq"
echo "wrote $iq ($(stat -c %s "$iq") bytes)"
python3 "$here/tools/gen_iq_grids.py" "$llama/src/ggml/src/ggml-common.h"
