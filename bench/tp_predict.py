#!/usr/bin/env python3
"""Decode tokens/s of a tensor-parallel 70B Llama over N hosts, on paper, from measured all-reduce figures.

    python3 bench/tp_predict.py COMM.jsonl... [--path veth] [--bandwidth 105,300] [--bits 8.5] [--delay-us 50]
                                              [--split-min-bytes 65536]

COMM.jsonl: bench/comm_netns.sh's lines (bench_comm --json with a "path"). From the lines of --path (a
prefix: "veth" matches "veth (no netem in this kernel)"), the all-reduce of one 4096- and one 8192-wide row
(16 and 32 KB; the median over the files of each size's median) gives a latency alpha and a per-byte cost
1/beta: t(s) = alpha + s / beta through the two points.

The model (ultra's forward, src/model/forward.cpp, and the MPI transport's algorithms, src/dist):
  per decoded token: 2 L + 1 all-reduces of dim floats (the embedding's, then Wo's and Wdown's in each layer),
  one all-gather of V / N logits per rank, two broadcasts of the step (header, rows) from rank 0;
  t_allreduce(N) = alpha + delay + (N - 1) * 4 dim / beta   the direct exchange: each rank sends its block to
                                                            every other rank at once
                 = 2 (alpha + delay) + 2 (N - 1) / N * 4 dim / beta   the reduce-scatter + all-gather, which
                   the transport runs from 3 ranks on where the direct exchange would send more than
                   DistOptions::split_min_bytes per rank; by default the table takes the faster of the two
                   (marked "split" where that is the reduce-scatter: the option set for that network),
                   with --split-min-bytes B the transport's rule with that B
  t_allgather(N) = alpha + delay + (N - 1) * 4 V / N / beta
  t_broadcast    = alpha + delay
  compute: every weight but the embedding table streamed once per token from memory, split evenly over the N
  hosts, at the stated bandwidth per host; no overlap of communication and compute (ultra's collectives are
  synchronous); attention over a short context (its KV reads are left out).
--delay-us adds a one-way network delay to every message (what tc netem would add on each side of the veth).
"""
import argparse
import json
import statistics
from collections import defaultdict

# Llama-3-70B: 80 layers, dim 8192, 64 query heads and 8 KV heads of 128, FFN 28672, vocabulary 128256.
L, DIM, FFN, NH, NKV, HD, VOCAB = 80, 8192, 28672, 64, 8, 128, 128256


def params():
    per_layer = DIM * NH * HD + 2 * DIM * NKV * HD + NH * HD * DIM + 3 * DIM * FFN + 2 * DIM
    total = L * per_layer + 2 * VOCAB * DIM + DIM
    return total, total - VOCAB * DIM  # all, streamed per token (the embedding is looked up, not read)


def fit(files, path):
    med = defaultdict(list)
    for f in files:
        for line in open(f):
            j = json.loads(line)
            if j["path"].startswith(path) and j["op"] == "all_reduce_sum" and j["transport"] == "MPI":
                med[j["bytes"]].append(j["p50_us"] * 1e-6)
    t1, t2 = statistics.median(med[4096 * 4]), statistics.median(med[8192 * 4])
    inv_beta = (t2 - t1) / (8192 * 4 - 4096 * 4)
    return t1 - 4096 * 4 * inv_beta, 1 / inv_beta, t1, t2


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--path", default="veth")
    ap.add_argument("--bandwidth", default="105,300", help="memory bandwidth per host, GB/s (comma list)")
    ap.add_argument("--bits", type=float, default=8.5, help="bits per weight (Q8_0: 8.5)")
    ap.add_argument("--delay-us", type=float, default=50)
    ap.add_argument("--split-min-bytes", type=int, default=None)
    a = ap.parse_args()
    alpha, beta, t1, t2 = fit(a.files, a.path)
    total, streamed = params()
    w = streamed * a.bits / 8
    print(f"measured ({a.path}): 16 KB all-reduce {t1 * 1e6:.1f} us, 32 KB {t2 * 1e6:.1f} us -> "
          f"alpha {alpha * 1e6:.1f} us, beta {beta / 1e9:.2f} GB/s")
    print(f"70B: {total / 1e9:.2f}B parameters, {total * a.bits / 8 / 1e9:.1f} GB at {a.bits} bits per weight, "
          f"{w / 1e9:.1f} GB read per token")
    bws = [float(b) * 1e9 for b in a.bandwidth.split(",")]
    delays = [0.0, a.delay_us * 1e-6]
    head = ["hosts", "weights per host"] + [f"compute ms/token at {b / 1e9:.0f} GB/s" for b in bws]
    head += [f"comm ms/token, delay {d * 1e6:.0f} us" for d in delays]
    head += [f"tok/s at {b / 1e9:.0f} GB/s, delay {d * 1e6:.0f} us" for b in bws for d in delays]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for n in (1, 2, 4, 8):
        comm = []
        for d in delays:
            if n == 1:
                comm.append((0.0, False))
                continue
            direct = alpha + d + (n - 1) * 4 * DIM / beta
            split = 2 * (alpha + d) + 2 * (n - 1) / n * 4 * DIM / beta if n >= 3 else direct
            if a.split_min_bytes is None:
                use_split = split < direct
            else:
                use_split = n >= 3 and (n - 1) * 4 * DIM > a.split_min_bytes
            ar = split if use_split else direct
            ag = alpha + d + (n - 1) * 4 * VOCAB / n / beta
            comm.append(((2 * L + 1) * ar + ag + 2 * (alpha + d), use_split))
        comp = [w / (n * b) for b in bws]
        row = [str(n), f"{total * a.bits / 8 / n / 1e9:.1f} GB"] + [f"{c * 1e3:.0f}" for c in comp]
        row += [f"{m * 1e3:.1f}{' split' if sp else ''}" for m, sp in comm]
        row += [f"{1 / (c + m):.2f} ({100 * m / (c + m):.0f}% comm)" for c in comp for m, _ in comm]
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
