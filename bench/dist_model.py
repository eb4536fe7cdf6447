#!/usr/bin/env python3
"""A model of a data-parallel DLRM step versus ranks and link bandwidth
(docs/distributed.md, "Scaling on paper").

Strong scaling: the global batch G is fixed; each of P ranks takes b = G / P
rows. A step on one rank costs

  T(P) = compute = t_row * b + t_fixed            (measured or assumed)
       + a2a_bytes(P) / bw(P) + 2 lat_a2a         the embedding exchanges (out, back)
       + max(0, t_ar - hide * 2/3 compute)        the dense gradients' allreduce,
  t_ar = ar_bytes(P) / bw(P) + lat_ar log2 P      partly hidden under the backward

with bw(P) the bandwidth a rank has to its peers: NVLink inside a node of g
GPUs, the network beyond it (the share of the bytes that leaves the node
goes at the network's speed). Two ways to exchange embeddings:

  pooled (TorchRec, HugeCTR): a sample's F pooled vectors go out and their
    gradients come back: 2 F D e bytes a sample, (P-1)/P of them to peers;
  per lookup (dlrec today): each unique row a part needs comes from its owner
    (U (4 + D e)) and each lookup's gradient goes back (L (4 + 4 D)); exact
    in the order of one process, but L/F times the pooled bytes for
    multi-hot data (Criteo 1TB: L = 214 lookups over F = 26 columns).

Efficiency at P against P0 ranks: (P0 T(P0)) / (P T(P)).

usage: bench/dist_model.py            the MLPerf-shaped table (H100 inputs assumed)
       bench/dist_model.py --measured dlrec-train.json --ranks P --batch B [--params W]
  With --measured (the summary of `mpirun -np P dlrec train` at batch B,
  e.g. from bench/dist.sh), the model takes that run's compute a row and
  exchange bytes a row and predicts the step of CPU ranks, one a machine,
  over Ethernet links.
"""
import argparse
import json
import math


def step_time(P, G, t_row, t_fixed, bytes_a2a_row, bytes_ar, g, nvlink, net, lat_a2a, lat_ar, hide):
    b = G / P
    compute = t_row * b + t_fixed
    a2a = (P - 1) / P * b * bytes_a2a_row
    inter = max(0.0, (P - g) / P)  # the share of a rank's peers on other nodes
    t_a2a = a2a * (1 - inter) / nvlink + a2a * inter / net + 2 * lat_a2a
    ar = 2 * (P - 1) / P * bytes_ar
    # Hierarchical allreduce: inside the node on NVLink, across nodes on 1/g of it.
    t_ar = ar / nvlink if P <= g else ar / nvlink + ar / g / net
    t_ar += lat_ar * math.log2(P) if P > 1 else 0
    # The backward (about 2/3 of the compute) hides `hide` of it.
    return compute, t_a2a, max(0.0, t_ar - hide * 2 / 3 * compute)


def mlperf_table():
    # The Criteo 1TB shape of MLPerf's DLRM-DCNv2: 26 columns of dim 128,
    # 214 lookups a sample (the multi-hot sizes), ~16M dense parameters
    # (bottom 13-512-256-128, 3 low-rank cross layers of rank 512 on 3456
    # inputs, top 1024-1024-512-256-1), global batch 65536, 16-bit exchanges.
    F, D, L, W, G, e = 26, 128, 214, 16.0e6, 65536, 2
    # H100, assumed: 0.5 us of compute a sample on one GPU (2M samples/s),
    # 50 us fixed a step (launches, the optimizer), NVLink 300 GB/s
    # achieved a GPU, 8 GPUs a node, InfiniBand 400 Gb/s a GPU (~40 GB/s
    # achieved), 50 us an all-to-all call, 30 us a hop of an allreduce, and
    # half the backward overlapping the allreduce (as NCCL on a side stream).
    t_row, t_fixed, g, nvlink, net, lat_a2a, lat_ar, hide = 0.5e-6, 50e-6, 8, 300e9, 40e9, 50e-6, 30e-6, 0.5
    pooled = 2 * F * D * e
    per_lookup = L * (4 + D * e) + L * (4 + 4 * D)  # every lookup unique: the upper bound
    print("Criteo 1TB shape, global batch %d, H100 inputs assumed (see the script)" % G)
    print("%5s | %-34s | %-34s" % ("", "pooled exchange (TorchRec, HugeCTR)", "per-lookup exchange (dlrec today)"))
    print("%5s | %8s %8s %8s %6s | %8s %8s %8s %6s" % ("GPUs", "compute", "a2a", "ar left", "eff", "compute", "a2a",
                                                      "ar left", "eff"))
    base = {}
    for P in (8, 16, 32, 64, 128):
        row = []
        for name, bpr in (("pooled", pooled), ("lookup", per_lookup)):
            c, a, r = step_time(P, G, t_row, t_fixed, bpr, W * e, g, nvlink, net, lat_a2a, lat_ar, hide)
            T = c + a + r
            base.setdefault(name, 8 * T)
            row += [c * 1e3, a * 1e3, r * 1e3, base[name] / (P * T) * 100]
        print("%5d | %7.2fms %7.2fms %7.2fms %5.0f%% | %7.2fms %7.2fms %7.2fms %5.0f%%" % (P, *row))


def cpu_table(path, P0, G, W):
    """The model fed with a measured run (P0 ranks, batch G, W dense
    parameters): its compute a row and its exchange bytes a row, for CPU
    ranks one to a machine over Ethernet."""
    j = json.load(open(path))
    d = j["distributed"]
    steps = j["steps"]
    b = G / P0
    t_row = d["compute_seconds"] / steps / b
    ar = 2 * (P0 - 1) / P0 * W * 4
    bytes_row = max(0.0, d["rank0_bytes_sent_per_step"] - ar) / ((P0 - 1) / P0 * b)
    print("measured (%d ranks, batch %d): %.1f us of compute a row on one rank, %.0f exchange bytes a row "
          "(rows in, gradients out), %.2f MB of dense allreduce" % (P0, G, t_row * 1e6, bytes_row, ar / 1e6))
    print("CPU ranks one to a machine, batch %d, the allreduce not hidden, 50 us a call:" % G)
    links = (("10 GbE", 1.1e9), ("25 GbE", 2.8e9), ("100 Gb", 11e9))
    print("%6s | " % "ranks" + " | ".join("%-22s" % n for n, _ in links))
    base = {}
    for P in (2, 4, 8, 16, 32, 64):
        cells = []
        for name, bw in links:
            c, a, r = step_time(P, G, t_row, 0.0, bytes_row, W * 4, 1, bw, bw, 50e-6, 50e-6, 0.0)
            T = c + a + r
            base.setdefault(name, 2 * T)
            cells.append("%7.1fms eff %4.0f%%" % (T * 1e3, base[name] / (P * T) * 100))
        print("%6d | " % P + " | ".join("%-22s" % x for x in cells))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--measured")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--params", type=float, default=475985, help="dense parameters (the Kaggle-shaped DLRM's)")
    a = ap.parse_args()
    if a.measured:
        cpu_table(a.measured, a.ranks, a.batch, a.params)
    else:
        mlperf_table()
