#!/usr/bin/env python3
"""Writes tests/golden/dlrm_tiny.txt: a tiny DLRM's inputs and parameters with
its forward outputs and analytic gradients, computed in float64 by a plain
NumPy implementation written independently of dlrec (tests/test_golden.c
compares dlrec's fp32 results against it).

The model: bottom MLP (ReLU on every layer, the last included), sum (or mean)
pooled embedding bags, DLRM's dot interaction
    concat(x, [Z_i . Z_j for i in 1..F for j in 0..i-1]),  Z = [x; e_1..e_F],
top MLP (ReLU on every layer but the last), logits, sigmoid, and the mean
binary cross-entropy on the logits. Dense parameters are flat in dlrec's
layout: per layer, bottom layers then top layers, weight (OUT, IN) row-major
then bias (OUT).

Inputs and parameters are rounded to float32 before anything is computed, so
the C test feeds dlrec exactly the values the reference used. The gradients
are checked against central finite differences (float64) before the file is
written.

Usage: /usr/bin/python3 tests/golden/make_dlrm_golden.py [OUTPUT]
"""
import os
import sys

import numpy as np

from golden_format import Sections, f32

N_DENSE = 3
COL_ROWS = [5, 7, 4]  # rows of each column's range in the fused table
EMB_DIM = 4
BOTTOM = [5, 4]
TOP = [6, 1]
POOLING = 0  # 0 = sum, 1 = mean (dlrec_pooling)
LABELS = [1.0, 0.0, 0.0, 1.0]
# Local ids of each bag, per column then sample: the middle column is
# multi-hot with an empty bag and a repeated id; a row is shared by samples.
BAGS = [
    [[0], [4], [0], [2]],
    [[], [1], [3, 5], [2, 6, 2]],
    [[1], [0], [3], [2]],
]
B = len(LABELS)
F = len(COL_ROWS)
FIRST_SEED = 1
MARGIN = 1e-2  # every ReLU pre-activation at least this far from 0


def layer_shapes():
    shapes, fan_in = [], N_DENSE
    for w in BOTTOM:
        shapes.append((w, fan_in))
        fan_in = w
    fan_in = EMB_DIM + F * (F + 1) // 2
    for w in TOP:
        shapes.append((w, fan_in))
        fan_in = w
    return shapes


def unflatten(p):
    layers, off = [], 0
    for out, inp in layer_shapes():
        w = p[off:off + out * inp].reshape(out, inp)
        off += out * inp
        b = p[off:off + out]
        off += out
        layers.append((w, b))
    assert off == p.size
    return layers[:len(BOTTOM)], layers[len(BOTTOM):]


def n_params():
    return sum(o * i + o for o, i in layer_shapes())


def global_ids():
    begins = np.cumsum([0] + COL_ROWS[:-1])
    return [[[int(begins[c]) + i for i in bag] for bag in BAGS[c]] for c in range(F)]


def pool(table, gids):
    emb = np.zeros((B, F, EMB_DIM))
    for c in range(F):
        for b in range(B):
            ids = gids[c][b]
            for r in ids:
                emb[b, c] += table[r]
            if POOLING == 1 and ids:
                emb[b, c] /= len(ids)
    return emb


PAIRS = [(i, j) for i in range(1, F + 1) for j in range(i)]


def forward(params, dense, emb):
    """Returns the logits and what the backward needs."""
    bottom, top = unflatten(params)
    acts, pres = [dense], []
    h = dense
    for w, b in bottom:
        z = h @ w.T + b
        pres.append(z)
        h = np.maximum(z, 0.0)
        acts.append(h)
    x = h
    Z = np.concatenate([x[:, None, :], emb], axis=1)  # (B, F+1, D)
    inter = np.concatenate([x] + [np.sum(Z[:, i] * Z[:, j], axis=1, keepdims=True) for i, j in PAIRS], axis=1)
    tacts, tpres = [inter], []
    h = inter
    for l, (w, b) in enumerate(top):
        z = h @ w.T + b
        tpres.append(z)
        h = np.maximum(z, 0.0) if l + 1 < len(top) else z
        tacts.append(h)
    logits = h[:, 0]
    return logits, dict(acts=acts, pres=pres, Z=Z, tacts=tacts, tpres=tpres)


def bce(logits, labels):
    z = logits
    return float(np.mean(np.maximum(z, 0.0) - z * labels + np.log1p(np.exp(-np.abs(z)))))


def sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def backward(params, dense, emb, labels):
    bottom, top = unflatten(params)
    logits, c = forward(params, dense, emb)
    grads_top = [None] * len(top)
    dz = ((sigmoid(logits) - labels) / B)[:, None]  # (B, 1): d loss / d logits
    for l in range(len(top) - 1, -1, -1):
        w, _ = top[l]
        inp = c["tacts"][l]
        grads_top[l] = (dz.T @ inp, dz.sum(axis=0))
        din = dz @ w
        if l > 0:
            din = din * (c["tpres"][l - 1] > 0)
        dz = din
    d_inter = dz  # (B, I)
    Z = c["Z"]
    dZ = np.zeros_like(Z)
    dZ[:, 0] += d_inter[:, :EMB_DIM]
    for k, (i, j) in enumerate(PAIRS):
        g = d_inter[:, EMB_DIM + k][:, None]
        dZ[:, i] += g * Z[:, j]
        dZ[:, j] += g * Z[:, i]
    d_emb = dZ[:, 1:].copy()
    dz = dZ[:, 0] * (c["pres"][-1] > 0)
    grads_bottom = [None] * len(bottom)
    for l in range(len(bottom) - 1, -1, -1):
        w, _ = bottom[l]
        inp = c["acts"][l]
        grads_bottom[l] = (dz.T @ inp, dz.sum(axis=0))
        if l > 0:
            dz = (dz @ w) * (c["pres"][l - 1] > 0)
    flat = np.concatenate([np.concatenate([gw.ravel(), gb]) for gw, gb in grads_bottom + grads_top])
    return logits, c, flat, d_emb


def fd_check(params, dense, table, gids, labels, grad, d_emb):
    eps = 1e-6

    def loss_p(p):
        return bce(forward(p, dense, pool(table, gids))[0], labels)

    def loss_e(e):
        return bce(forward(params, dense, e)[0], labels)

    def loss_t(t):
        return bce(forward(params, dense, pool(t, gids))[0], labels)

    worst = 0.0

    def cmp(what, idx, fd, an):
        nonlocal worst
        err = abs(fd - an)
        worst = max(worst, err)
        if err > 1e-7 + 1e-5 * abs(fd):
            sys.exit(f"finite-difference check failed: {what}[{idx}]: analytic {an!r}, finite difference {fd!r}")

    for i in range(params.size):
        up, down = params.copy(), params.copy()
        up[i] += eps
        down[i] -= eps
        cmp("grad", i, (loss_p(up) - loss_p(down)) / (2 * eps), grad[i])
    emb = pool(table, gids)
    for i in range(emb.size):
        up, down = emb.copy(), emb.copy()
        up.flat[i] += eps
        down.flat[i] -= eps
        cmp("d_emb", i, (loss_e(up) - loss_e(down)) / (2 * eps), d_emb.flat[i])
    # The table rows' gradient: d_emb scattered through the bags.
    d_table = np.zeros_like(table)
    for c in range(F):
        for b in range(B):
            ids = gids[c][b]
            for r in ids:
                d_table[r] += d_emb[b, c] / (len(ids) if POOLING == 1 else 1)
    for i in range(table.size):
        up, down = table.copy(), table.copy()
        up.flat[i] += eps
        down.flat[i] -= eps
        cmp("table", i, (loss_t(up) - loss_t(down)) / (2 * eps), d_table.flat[i])
    return worst


def make(seed):
    rng = np.random.default_rng(seed)
    dense = f32(rng.normal(0.0, 1.0, size=(B, N_DENSE)))
    parts = []
    for out, inp in layer_shapes():
        parts.append(rng.normal(0.0, np.sqrt(2.0 / (inp + out)), size=out * inp))
        parts.append(rng.normal(0.0, np.sqrt(1.0 / out), size=out))
    params = f32(np.concatenate(parts))
    table = f32(rng.uniform(-0.8, 0.8, size=(sum(COL_ROWS), EMB_DIM)))
    return dense, params, table


def well_conditioned(params, dense, emb):
    """No ReLU input near its kink (fp32 and float64 agree on every mask, and
    finite differences stay on one side), every ReLU layer with inactive
    entries but no unit dead for the whole batch (so that every bias has a
    nonzero gradient; a weight's gradient can still be 0 where its input and
    output units are never active on the same sample), and probabilities
    away from 0 and 1."""
    logits, c = forward(params, dense, emb)
    for z in c["pres"] + c["tpres"][:-1]:
        if np.min(np.abs(z)) < MARGIN or not (z < 0).any() or not (z > 0).any(axis=0).all():
            return False
    p = sigmoid(logits)
    return bool(np.all((p > 0.05) & (p < 0.95)))


def main():
    out_path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                  "dlrm_tiny.txt")
    gids = global_ids()
    labels = np.array(LABELS)
    for seed in range(FIRST_SEED, FIRST_SEED + 1000):
        dense, params, table = make(seed)
        if well_conditioned(params, dense, pool(table, gids)):
            break
    else:
        sys.exit("no well-conditioned seed found")
    assert params.size == n_params()
    emb = pool(table, gids)
    logits, _, grad, d_emb = backward(params, dense, emb, labels)
    probs = sigmoid(logits)
    loss = bce(logits, labels)
    worst = fd_check(params, dense, table, gids, labels, grad, d_emb)
    print(f"seed {seed}: loss {loss:.6f}, {params.size} params, finite-difference check passed "
          f"(max |analytic - fd| {worst:.2e})")

    sections = Sections()
    sec = sections.add

    begins = np.cumsum([0] + COL_ROWS[:-1])
    sec("seed", "i", [seed])
    sec("n_dense", "i", [N_DENSE])
    sec("n_sparse", "i", [F])
    sec("emb_dim", "i", [EMB_DIM])
    sec("bottom", "i", BOTTOM)
    sec("top", "i", TOP)
    sec("pooling", "i", [POOLING])
    sec("batch", "i", [B])
    sec("table_rows", "i", [sum(COL_ROWS)])
    sec("id_ranges", "i", [v for c in range(F) for v in (begins[c], begins[c] + COL_ROWS[c])])
    sec("max_hotness", "i", [max(len(bag) for bag in BAGS[c]) for c in range(F)])
    sec("dense", "f32", dense)
    sec("labels", "f32", labels)
    for c in range(F):
        offs = np.cumsum([0] + [len(bag) for bag in gids[c]])
        sec(f"offsets{c}", "i", offs)
        sec(f"ids{c}", "i", [r for bag in gids[c] for r in bag])
    sec("table", "f32", table)
    sec("params", "f32", params)
    sec("logits", "f64", logits)
    sec("probs", "f64", probs)
    sec("loss", "f64", [loss])
    sec("grad", "f64", grad)
    sec("d_emb", "f64", d_emb)

    header = (
        "# dlrec golden file: a tiny DLRM's inputs, parameters, forward outputs and gradients,\n"
        "# computed in float64 by tests/golden/make_dlrm_golden.py (NumPy, independent of dlrec);\n"
        "# read by tests/test_golden.c. Do not edit: regenerate with\n"
        "#   /usr/bin/python3 tests/golden/make_dlrm_golden.py\n"
        "# Format: sections \"@NAME TYPE COUNT\" (TYPE i: integers, f: floats), each followed by\n"
        "# COUNT whitespace-separated values. Shapes: dense (batch, n_dense); offsetsC (batch+1)\n"
        "# and idsC (global ids) per sparse column C; table (table_rows, emb_dim); params flat\n"
        "# (per layer, bottom then top: weight (OUT, IN) row-major, then bias (OUT)); grad like\n"
        "# params; d_emb (batch, n_sparse, emb_dim). pooling: 0 sum, 1 mean. loss: mean BCE on logits.\n"
    )
    text = sections.text(header, "dlrm")
    with open(out_path, "w") as f:
        f.write(text)
    print(f"wrote {out_path} ({len(text)} bytes)")


if __name__ == "__main__":
    main()
