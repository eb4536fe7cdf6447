#!/usr/bin/python3
"""PyTorch DLRM, the peer that bench/train_vs_torch.sh measures dlrec training against.

The model is the DLRM reference's (facebookresearch/dlrm, dlrm_s_pytorch.py)
Criteo Kaggle configuration, the same as examples/dlrm_criteo.json:

  - 26 nn.EmbeddingBag(n_c, 16, mode="sum", sparse=True), one per sparse
    column; n_c = id_end - id_begin of the column, ids = global id - id_begin;
  - bottom MLP 13-512-256-64-16 (ReLU after each layer);
  - dot interaction without self-interaction: Z = [x; e_1..e_26] (27 x 16),
    the 351 dot products <Z_i, Z_j> for i in 1..26, j in 0..i-1 (in that
    order), concatenated after x: 16 + 351 = 367 features;
  - top MLP 367-512-256-1 (ReLU but the last), BCEWithLogitsLoss (mean);
  - one torch.optim.SGD(lr=0.1) over all parameters (dense and sparse:
    SGD applies the sparse gradients of the embedding bags directly);
  - init as the reference: embeddings U(-sqrt(1/n), sqrt(1/n)), MLP weights
    N(0, sqrt(2/(in+out))), biases N(0, sqrt(1/out)).

Data: the .dlr files that `dlrec etl apply` writes, read with numpy only
(np.memmap; the header, index and row-group layout of docs/formats.md, fixed
hotness 1 only). Shuffle: the same kind of scheme as dlrec's loader (not the
same RNG, so not the same order): the row groups in a random permutation, cut
into windows of --window-groups groups; the rows of a window cut into slices
of --slice-rows consecutive rows (a group's last slice may be shorter), and
the window's slices permuted. Batches are consecutive runs of that stream and
cross window boundaries; only the last one may be short. Reading the groups
from the mapping, shuffling and building the batch tensors are all inside the
timed loop; evaluation is not (as in dlrec's samples_per_s).

Evaluation: exact AUC by ranking (ties get their average rank), logloss from
the logits. Prints one JSON line:
  {"engine":"pytorch","batch":B,"threads":N,"samples_per_s":..,"auc":..,"logloss":..,"calibration":..}
(plus a few more fields).
"""

import argparse
import json
import math
import struct
import sys
import time

import numpy as np
import torch
import torch.nn as nn

MAGIC = b"\x89DLR\r\n\x1a\n"


def align64(x):
    return (x + 63) & ~63


class Dlr:
    """A read-only view of one .dlr file (docs/formats.md, version 1)."""

    def __init__(self, path):
        self.path = path
        self.mm = np.memmap(path, dtype=np.uint8, mode="r")
        mm = self.mm
        if bytes(mm[:8]) != MAGIC:
            raise SystemExit(f"{path}: not a .dlr file")
        version, hbytes, flags, n_dense, n_sparse, _res = struct.unpack_from("<6I", mm, 8)
        if version != 1:
            raise SystemExit(f"{path}: format version {version}; this reader reads version 1")
        rows, groups, index_offset, table_rows = struct.unpack_from("<4Q", mm, 32)
        if not flags & 1:
            raise SystemExit(f"{path}: incomplete file")
        if not flags & 2:
            raise SystemExit(f"{path}: no labels")
        self.rows, self.n_dense, self.n_sparse, self.table_rows = rows, n_dense, n_sparse, table_rows
        p = 112 + 48 * n_dense
        self.cols = []
        for c in range(n_sparse):
            hot, maxhot, b, e = struct.unpack_from("<2I2Q", mm, p + 72 * c + 48)
            if hot != 1:
                raise SystemExit(f"{path}: column {c} is not one-hot (hotness {hot}); only one-hot is supported")
            self.cols.append((b, e))
        if bytes(mm[index_offset:index_offset + 4]) != b"DLRI":
            raise SystemExit(f"{path}: bad index magic")
        (g2,) = struct.unpack_from("<Q", mm, index_offset + 8)
        if g2 != groups or index_offset + 16 + 24 * groups + 4 != len(mm):
            raise SystemExit(f"{path}: bad index")
        self.groups = []  # (offset, rows)
        for i in range(groups):
            off, nbytes, grows, _crc = struct.unpack_from("<QQII", mm, index_offset + 16 + 24 * i)
            self.groups.append((off, grows))
        self.gh = align64(16 + 8 * n_sparse)

    def group(self, i):
        """Views of group i: labels (rows,), dense (rows, n_dense), ids (n_sparse, rows) as lists."""
        off, rows = self.groups[i]
        mm = self.mm
        if bytes(mm[off:off + 4]) != b"DLRG":
            raise SystemExit(f"{self.path}: row group {i}: bad magic")
        a_lab = self.gh
        a_dense = align64(a_lab + 4 * rows)
        nxt = align64(a_dense + 4 * rows * self.n_dense)
        lab = np.frombuffer(mm, dtype=np.float32, count=rows, offset=off + a_lab)
        dense = np.frombuffer(mm, dtype=np.float32, count=rows * self.n_dense, offset=off + a_dense).reshape(
            rows, self.n_dense)
        ids = []
        for _ in range(self.n_sparse):
            ids.append(np.frombuffer(mm, dtype=np.uint32, count=rows, offset=off + nxt))
            nxt = align64(nxt + 4 * rows)
        return lab, dense, ids


def batches(f, batch, shuffle, rng, window_groups, slice_rows, max_rows=0):
    """Yields (labels f32 (n,), dense f32 (n, D), ids int64 (n, S) local ids) numpy batches."""
    begins = np.array([b for b, _ in f.cols], dtype=np.int64)
    order = rng.permutation(len(f.groups)) if shuffle else np.arange(len(f.groups))
    carry = None
    left = max_rows if max_rows else f.rows
    for w in range(0, len(order), window_groups):
        win = order[w:w + window_groups]
        parts = [f.group(int(g)) for g in win]
        lab = np.concatenate([p[0] for p in parts])
        dense = np.concatenate([p[1] for p in parts])
        ids = np.empty((lab.shape[0], f.n_sparse), dtype=np.int64)
        r0 = 0
        for p in parts:
            n = p[0].shape[0]
            for c in range(f.n_sparse):
                ids[r0:r0 + n, c] = p[2][c]
            r0 += n
        ids -= begins
        if shuffle:
            # slices of slice_rows rows, never crossing a group boundary
            starts, lens = [], []
            r0 = 0
            for p in parts:
                n = p[0].shape[0]
                s = np.arange(r0, r0 + n, slice_rows)
                starts.append(s)
                lens.append(np.minimum(slice_rows, r0 + n - s))
                r0 += n
            starts = np.concatenate(starts)
            lens = np.concatenate(lens)
            perm = rng.permutation(len(starts))
            starts, lens = starts[perm], lens[perm]
            # row index of every row in the permuted stream
            cum = np.cumsum(lens)
            pos = np.arange(cum[-1]) - np.repeat(cum - lens, lens)
            idx = np.repeat(starts, lens) + pos
            lab, dense, ids = lab[idx], dense[idx], ids[idx]
        if carry is not None:
            lab = np.concatenate([carry[0], lab])
            dense = np.concatenate([carry[1], dense])
            ids = np.concatenate([carry[2], ids])
        n = lab.shape[0]
        r = 0
        while n - r >= batch and left > 0:
            k = min(batch, left)
            yield lab[r:r + k], dense[r:r + k], ids[r:r + k]
            r += k
            left -= k
        if left <= 0:
            return
        carry = (lab[r:], dense[r:], ids[r:])
    if carry is not None and carry[0].shape[0] and left > 0:
        k = min(carry[0].shape[0], left)
        yield carry[0][:k], carry[1][:k], carry[2][:k]


def mlp(widths, last_relu):
    layers = []
    for i in range(len(widths) - 1):
        n, m = widths[i], widths[i + 1]
        lin = nn.Linear(n, m, bias=True)
        with torch.no_grad():
            lin.weight.normal_(0.0, math.sqrt(2.0 / (m + n)))
            lin.bias.normal_(0.0, math.sqrt(1.0 / m))
        layers.append(lin)
        if i < len(widths) - 2 or last_relu:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    def __init__(self, table_sizes, dim, n_dense, bottom, top):
        super().__init__()
        self.embs = nn.ModuleList()
        for n in table_sizes:
            e = nn.EmbeddingBag(n, dim, mode="sum", sparse=True)
            with torch.no_grad():
                e.weight.uniform_(-math.sqrt(1.0 / n), math.sqrt(1.0 / n))
            self.embs.append(e)
        self.bot = mlp([n_dense] + bottom, last_relu=True)
        nf = len(table_sizes) + 1
        li, lj = torch.tril_indices(nf, nf, offset=-1)  # i in 1..nf-1, j in 0..i-1, i-major
        self.register_buffer("li", li, persistent=False)
        self.register_buffer("lj", lj, persistent=False)
        self.top = mlp([dim + nf * (nf - 1) // 2] + top, last_relu=False)

    def forward(self, dense, ids):
        x = self.bot(dense)
        ly = [e(ids[:, k:k + 1]) for k, e in enumerate(self.embs)]  # 2D input: bags of 1
        t = torch.cat([x] + ly, dim=1).view(x.shape[0], -1, x.shape[1])
        z = torch.bmm(t, t.transpose(1, 2))
        r = torch.cat([x, z[:, self.li, self.lj]], dim=1)
        return self.top(r).squeeze(1)


def auc_exact(y, p):
    """AUC by ranking; tied scores get the average of their ranks."""
    y = np.asarray(y, dtype=np.float64)
    pos = float((y > 0.5).sum())
    neg = float(y.shape[0] - pos)
    if pos == 0 or neg == 0:
        return float("nan")
    uniq, inv, cnt = np.unique(p, return_inverse=True, return_counts=True)
    first = np.cumsum(cnt) - cnt  # 0-based rank of each distinct value's first row
    avg = first + (cnt + 1) / 2.0  # 1-based average rank of the tie group
    ranks = avg[inv]
    return float((ranks[y > 0.5].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--train", required=True)
    ap.add_argument("--valid", required=True)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-rows", type=int, default=0, help="train on at most this many rows (0: all)")
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--window-groups", type=int, default=8)
    ap.add_argument("--slice-rows", type=int, default=32)
    ap.add_argument("--no-shuffle", action="store_true")
    ap.add_argument("--eval-batch", type=int, default=4096)
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    rng = np.random.default_rng(a.seed)
    tr, va = Dlr(a.train), Dlr(a.valid)
    sizes = [e - b for b, e in tr.cols]
    model = DLRM(sizes, 16, tr.n_dense, [512, 256, 64, 16], [512, 256, 1])
    opt = torch.optim.SGD(model.parameters(), lr=a.lr)
    lossf = nn.BCEWithLogitsLoss()

    model.train()
    samples = steps = 0
    t0 = time.perf_counter()
    for lab, dense, ids in batches(tr, a.batch, not a.no_shuffle, rng, a.window_groups, a.slice_rows, a.max_rows):
        y = torch.from_numpy(lab)
        xd = torch.from_numpy(dense)
        xi = torch.from_numpy(ids)
        opt.zero_grad(set_to_none=True)
        loss = lossf(model(xd, xi), y)
        loss.backward()
        opt.step()
        samples += lab.shape[0]
        steps += 1
    train_s = time.perf_counter() - t0
    train_loss = float(loss.item()) if steps else float("nan")

    model.eval()
    ys, zs = [], []
    with torch.no_grad():
        for lab, dense, ids in batches(va, a.eval_batch, False, rng, 1, 1):
            zs.append(model(torch.from_numpy(dense), torch.from_numpy(ids)).double().numpy())
            ys.append(lab.astype(np.float64))
    y = np.concatenate(ys)
    z = np.concatenate(zs)
    # logloss from the logits: softplus(z) - y z, stable for any z
    logloss = float(np.mean(np.logaddexp(0.0, z) - y * z))
    auc = auc_exact(y, z)  # the sigmoid is monotone: ranking the logits is ranking the probabilities
    calibration = float(np.mean(1.0 / (1.0 + np.exp(-z))) / np.mean(y))  # mean prediction / observed CTR
    print(json.dumps({
        "engine": "pytorch", "batch": a.batch, "threads": a.threads,
        "samples_per_s": samples / train_s if train_s > 0 else 0.0,
        "auc": auc, "logloss": logloss, "calibration": calibration,
        "samples": samples, "steps": steps, "seconds": train_s, "train_loss_last_batch": train_loss,
        "valid_rows": int(y.shape[0]), "torch": torch.__version__,
    }))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
