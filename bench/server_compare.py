#!/usr/bin/env python3
"""ultra serve vs llama.cpp's llama-server on the CPU under the same concurrent streaming load.

Both servers run on the same GGUF (default: the bundled models/target.gguf) with the same threads, one KV slot
per stream of the largest stream count (`--parallel N`), and the same context per slot. bench_server
(bench/bench_server.cpp) sends exactly the same requests to both: at each stream count S (default 1, 8, 32),
S client threads each send --requests streaming /v1/completions requests one after another (text prompts,
seeded sampling at temperature 0.8 / top-k 40 / top-p 0.95 / min-p 0.05, ignore_eos so that every request
yields -n tokens: checked), after a warm-up round at the largest S. Measured per server: aggregate tokens/s,
time to first token (TTFT) and inter-token latency (ITL), p50 and p99.

  1. llama-server, built natively from the llama.cpp source that node-llama-cpp ships (bench/llamacpp_build.py,
     shared with bench/cpu_compare.py: cloned into --llama-dir once, built with -DGGML_NATIVE=ON), is started
     with -m MODEL -c CTX*N --parallel N -t T -tb T (its -c is the whole KV cache, split into N slots of CTX),
     waited for on /health, driven by `bench_server --url`, and stopped;
  2. then bench_server runs ultra's server in process with -m MODEL -t T -c CTX (N slots);
  3. one table: each stream count x metric for both, and ultra / llama.cpp.

The two runs are one after the other, not interleaved: on a shared machine, background load moves each by
tens of percent (the table prints the load average before each run).

    python3 bench/server_compare.py [--streams 1,8,32] [-n 64] [--requests 2] [--threads 2] [--ctx 256]
                                    [--model models/target.gguf] [--build build] [--llama-dir DIR]
                                    [--llama-variant native|noamx] [--jobs N] [--json OUT.json]

Needs: `cmake --build build --target bench_server`; for llama-server, node-llama-cpp's bundle (`cd bench &&
npm ci`) or an existing clone in --llama-dir, cmake and a C++ compiler (the first build of llama-server
takes a while: --jobs sets its parallel compile jobs).
"""
import argparse
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llamacpp_build import DEFAULT_LLAMA_DIR, llama_binary  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METRICS = [("aggregate_tps", "aggregate tok/s"), ("ttft_p50_ms", "TTFT p50 ms"), ("ttft_p99_ms", "TTFT p99 ms"),
           ("itl_p50_ms", "ITL p50 ms"), ("itl_p99_ms", "ITL p99 ms")]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_health(url, proc, timeout):
    """Polls url/health until it answers 200; exits when the server died or the time is up."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return True
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        time.sleep(0.5)
    return False


def bench_server(binary, args, extra):
    """Runs bench_server (the same load, plus `extra` arguments) with --json; returns (header, {streams: row})."""
    cmd = [binary, "--streams", args.streams, "-n", str(args.n), "--requests", str(args.requests), "--json"] + extra
    print("$ " + " ".join(cmd), flush=True)
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"bench_server failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    lines = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    return lines[0], {row["streams"]: row for row in lines[1:]}


def loadavg():
    try:
        return "load average %.2f %.2f %.2f" % os.getloadavg()
    except OSError:
        return "load average n/a"


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--streams", default="1,8,32", help="stream counts, comma-separated")
    ap.add_argument("-n", type=int, default=64, help="tokens per request")
    ap.add_argument("--requests", type=int, default=2, help="requests per stream, one after another")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=256, help="context per slot (llama-server: -c CTX * slots)")
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "target.gguf"))
    ap.add_argument("--build", default="build", help="ultra's build directory (holds bench_server)")
    ap.add_argument("--llama-dir", default=DEFAULT_LLAMA_DIR)
    ap.add_argument("--llama-variant", choices=["native", "noamx"], default="native")
    ap.add_argument("--jobs", type=int, default=None, help="compile jobs for building llama-server")
    ap.add_argument("--startup-timeout", type=float, default=300, help="seconds to wait for llama-server's /health")
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args()
    try:
        streams = [int(s) for s in args.streams.split(",")]
        if not streams or min(streams) < 1:
            raise ValueError
    except ValueError:
        ap.error(f"--streams {args.streams!r}: expected positive integers separated by commas")
    for name in ("n", "requests", "threads", "ctx"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1")
    slots = max(streams)
    model = os.path.abspath(args.model)
    if not os.path.isfile(model):
        sys.exit(f"{model}: no such file")
    bench = os.path.join(ROOT, args.build, "bench_server")
    if not os.path.exists(bench):
        sys.exit(f"{bench} not found: cmake --build {args.build} --target bench_server")

    llama_server = llama_binary(args.llama_dir, "llama-server", args.llama_variant, args.jobs)
    print(f"CPU: {cpu_name()}, {os.cpu_count()} logical cores; {args.threads} threads per server; "
          f"{slots} slots of {args.ctx} tokens; model {os.path.relpath(model, ROOT)}", flush=True)

    # 1. llama-server
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tempfile.NamedTemporaryFile("w+", prefix="llama-server-", suffix=".log", delete=False)
    cmd = [llama_server, "-m", model, "-c", str(args.ctx * slots), "--parallel", str(slots), "-t", str(args.threads),
           "-tb", str(args.threads), "--host", "127.0.0.1", "--port", str(port), "--no-webui"]
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.path.dirname(llama_server) + os.pathsep + env.get("LD_LIBRARY_PATH", "")
    print("$ " + " ".join(cmd) + f"   (log: {log.name})", flush=True)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        if not wait_health(url, proc, args.startup_timeout):
            log.seek(0)
            sys.exit(f"llama-server did not become healthy (exit code {proc.poll()}):\n{log.read()[-3000:]}")
        print(f"llama.cpp run: {loadavg()}", flush=True)
        _, llama = bench_server(bench, args, ["--url", url])
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    commit = ""
    try:
        commit = subprocess.run(["git", "-C", os.path.join(args.llama_dir, "src"), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True).stdout.strip()
    except OSError:
        pass

    # 2. ultra, in process
    print(f"ultra run: {loadavg()}", flush=True)
    ultra_head, ultra = bench_server(bench, args, ["-m", model, "-t", str(args.threads), "-c", str(args.ctx)])

    # 3. the table
    print(f"\nllama.cpp: llama-server {commit} ({args.llama_variant} build); ultra: {ultra_head['server']}")
    print(f"{args.n} tokens per request, {args.requests} request(s) per stream; ratio = ultra / llama.cpp "
          f"(tok/s: above 1 is ultra faster; latencies: below 1 is ultra faster)\n")
    print("| streams | metric | ultra | llama.cpp | ratio |")
    print("|---:|---|---:|---:|---:|")
    rows = []
    for s in streams:
        for key, label in METRICS:
            u, l = ultra[s][key], llama[s][key]
            ratio = u / l if l else float("nan")
            rows.append(dict(streams=s, metric=key, ultra=u, llama_cpp=l, ratio=ratio))
            fmt = "%.1f" if key == "aggregate_tps" or key.startswith("ttft") else "%.2f"
            print(f"| {s} | {label} | {fmt % u} | {fmt % l} | {ratio:.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(cpu=cpu_name(), threads=args.threads, slots=slots, ctx=args.ctx, n=args.n,
                           requests=args.requests, llama_cpp_commit=commit, llama_variant=args.llama_variant,
                           rows=rows, ultra=ultra, llama_cpp=llama), f, indent=1)


if __name__ == "__main__":
    main()
