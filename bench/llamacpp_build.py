"""llama.cpp built natively from the source node-llama-cpp ships: shared by bench/cpu_compare.py (llama-bench)
and bench/server_compare.py (llama-server). A module, not a script:

    from llamacpp_build import llama_binary, DEFAULT_LLAMA_DIR
    path = llama_binary(DEFAULT_LLAMA_DIR, "llama-server")

The source is node-llama-cpp's git bundle (bench/node_modules/node-llama-cpp/llama/gitRelease.bundle, from
`cd bench && npm ci`), cloned once into LLAMA_DIR/src; each variant builds in its own directory
(LLAMA_DIR/build: -DGGML_NATIVE=ON; LLAMA_DIR/build-noamx: every x86 extension up to AVX-512 VNNI / BF16 but
AMX, for VMs whose AMX tile state is not granted). A target is built when its binary is missing; the clone is
redone when its commit is not the bundle's. Without the bundle an existing clone is used as it is.
"""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUNDLE = os.path.join(ROOT, "bench", "node_modules", "node-llama-cpp", "llama", "gitRelease.bundle")
DEFAULT_LLAMA_DIR = os.path.expanduser("~/.cache/ultra/llama.cpp-native")

NOAMX_FLAGS = ["-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_BMI2=ON", "-DGGML_FMA=ON",
               "-DGGML_F16C=ON", "-DGGML_AVX_VNNI=ON", "-DGGML_AVX512=ON", "-DGGML_AVX512_VBMI=ON",
               "-DGGML_AVX512_VNNI=ON", "-DGGML_AVX512_BF16=ON"]


def build_dir(llama_dir, variant="native"):
    return os.path.join(llama_dir, "build" if variant == "native" else "build-" + variant)


def source_commit(llama_dir):
    """The commit checked out in LLAMA_DIR/src ("" when there is none)."""
    src = os.path.join(llama_dir, "src")
    if not os.path.isdir(src):
        return ""
    return subprocess.run(["git", "-C", src, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()


def llama_binary(llama_dir, target="llama-bench", variant="native", jobs=None):
    """Path of llama.cpp's `target` (llama-bench, llama-server, ...) built natively in llama_dir, cloning the
    source from node-llama-cpp's bundle and building it first where needed (jobs: parallel compile jobs,
    default: every core)."""
    src = os.path.join(llama_dir, "src")
    have = source_commit(llama_dir)
    if os.path.exists(BUNDLE):
        head = subprocess.run(["git", "bundle", "list-heads", BUNDLE], capture_output=True, text=True).stdout.split()
        want = head[0] if head else ""
    elif have:
        print(f"{BUNDLE} not found: using the llama.cpp source already in {src} ({have[:10]})", flush=True)
        want = have
    else:
        sys.exit(f"{BUNDLE} not found: run `cd bench && npm ci` first")
    build = build_dir(llama_dir, variant)
    binary = os.path.join(build, "bin", target)
    if have != want or not os.path.exists(binary):
        print(f"building {target} (llama.cpp {want[:10]}, {variant}) in {build} ...", flush=True)
        if have != want:
            subprocess.run(["rm", "-rf", llama_dir], check=True)
            os.makedirs(llama_dir, exist_ok=True)
            subprocess.run(["git", "clone", "-q", BUNDLE, src], check=True)
        if not os.path.exists(os.path.join(build, "CMakeCache.txt")):
            flags = ["-DGGML_NATIVE=ON"] if variant == "native" else NOAMX_FLAGS
            subprocess.run(["cmake", "-S", src, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF",
                            "-DLLAMA_BUILD_TESTS=OFF"] + flags, check=True, capture_output=True)
        r = subprocess.run(["cmake", "--build", build, "-j", str(jobs or os.cpu_count() or 2), "--target", target],
                           capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"building {target} failed:\n{(r.stdout + r.stderr)[-3000:]}")
    return binary
