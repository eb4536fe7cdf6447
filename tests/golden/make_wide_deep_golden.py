#!/usr/bin/env python3
"""Writes tests/golden/wide_deep_tiny.txt and tests/golden/deepfm_tiny.txt:
a tiny Wide & Deep's and DeepFM's inputs and parameters with their forward
outputs and analytic gradients, computed in float64 by a plain NumPy
implementation written independently of dlrec (tests/test_golden.c compares
dlrec's fp32 results against them).

The models (docs/config.md): embedding rows D + 1 wide (D factors, then the
first-order weight), pooled by sum or mean into emb (B, F, D + 1), split into
v (B, F, D) and w (B, F);
    wide_deep: logit = dense . lw + lb + sum_f w_f + MLP([dense, v_1..v_F])
    deepfm:    the same + 1/2 sum_d ((sum_f v_fd)^2 - sum_f v_fd^2)
The MLP's hidden layers are Linear -> [BatchNorm1d] -> ReLU (no dropout
here: dlrec's masks are its own), then an output Linear to one logit. Batch
normalization follows PyTorch's BatchNorm1d (eps 1e-5, momentum 0.1): in
training the batch mean and biased variance normalize, and the running
statistics move toward the batch mean and the UNBIASED variance; scoring
normalizes with the running statistics. So the file's probabilities are the
scoring pass's (running statistics), while its loss and gradients are the
training pass's (batch statistics), and `state_after` is the flat parameter
array after that training pass (the running statistics moved).

Dense parameters are flat in dlrec's layout: linear.weight (1, n_dense),
linear.bias (1); per hidden layer weight (OUT, IN) row-major, bias (OUT),
and with batch norm bn.weight (OUT), bn.bias (OUT); the output layer's
weight (1, IN) and bias (1); then the buffers, per hidden layer
running_mean (OUT) and running_var (OUT).

Inputs and parameters are rounded to float32 before anything is computed, so
the C test feeds dlrec exactly the values the reference used. The gradients
are checked against central finite differences (float64) before the files
are written.

Usage: /usr/bin/python3 tests/golden/make_wide_deep_golden.py [OUTPUT_DIR]
"""
import os
import sys

import numpy as np

from golden_format import Sections, f32

N_DENSE = 3
COL_ROWS = [5, 7, 4]  # rows of each column's range in the fused table
EMB_DIM = 4  # D; the table's rows are D + 1 wide
MLP = [6, 5]
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
W = EMB_DIM + 1
BN_EPS = 1e-5
BN_MOMENTUM = 0.1
MARGIN = 1e-2  # every ReLU input at least this far from 0
# (name, FM term, batch norm, pooling: 0 sum, 1 mean)
MODELS = [("wide_deep", False, True, 0), ("deepfm", True, False, 1)]


class Layout:
    """Offsets of every tensor in the flat parameter array."""

    def __init__(self, bn):
        self.bn = bn
        off = 0

        def take(n):
            nonlocal off
            o = off
            off += n
            return o

        self.lw = take(N_DENSE)
        self.lb = take(1)
        self.layers = []  # (w, b, gamma, beta, out, in)
        fan_in = N_DENSE + F * EMB_DIM
        for out in MLP:
            w = take(out * fan_in)
            b = take(out)
            g = take(out) if bn else None
            be = take(out) if bn else None
            self.layers.append((w, b, g, be, out, fan_in))
            fan_in = out
        self.out_w = take(fan_in)
        self.out_b = take(1)
        self.out_in = fan_in
        self.n_trainable = off
        self.running = []  # (mean, var)
        if bn:
            for out in MLP:
                self.running.append((take(out), take(out)))
        self.n = off


def global_ids():
    begins = np.cumsum([0] + COL_ROWS[:-1])
    return [[[int(begins[c]) + i for i in bag] for bag in BAGS[c]] for c in range(F)]


def pool(table, gids, pooling):
    emb = np.zeros((B, F, W))
    for c in range(F):
        for b in range(B):
            ids = gids[c][b]
            for r in ids:
                emb[b, c] += table[r]
            if pooling == 1 and ids:
                emb[b, c] /= len(ids)
    return emb


def forward(lay, fm, p, dense, emb, train):
    """The logits, what the backward needs, and the parameters after the
    pass (the running statistics moved when training with batch norm)."""
    after = p.copy()
    v = emb[:, :, :EMB_DIM]
    wt = emb[:, :, EMB_DIM]
    lin = dense @ p[lay.lw:lay.lw + N_DENSE] + p[lay.lb]
    first = wt.sum(axis=1)
    s = v.sum(axis=1)
    second = 0.5 * (np.sum(s * s, axis=1) - np.sum(v * v, axis=(1, 2)))
    x = np.concatenate([dense, v.reshape(B, F * EMB_DIM)], axis=1)
    h = x
    cache = []
    for l, (wo, bo, go, beo, out, inp) in enumerate(lay.layers):
        Wm = p[wo:wo + out * inp].reshape(out, inp)
        z = h @ Wm.T + p[bo:bo + out]
        bn = None
        if lay.bn:
            gamma, beta = p[go:go + out], p[beo:beo + out]
            rm_o, rv_o = lay.running[l]
            if train:
                mu = z.mean(axis=0)
                var = z.var(axis=0)
                inv = 1.0 / np.sqrt(var + BN_EPS)
                after[rm_o:rm_o + out] = (1 - BN_MOMENTUM) * p[rm_o:rm_o + out] + BN_MOMENTUM * mu
                after[rv_o:rv_o + out] = (1 - BN_MOMENTUM) * p[rv_o:rv_o + out] + BN_MOMENTUM * var * B / (B - 1)
            else:
                mu = p[rm_o:rm_o + out]
                inv = 1.0 / np.sqrt(p[rv_o:rv_o + out] + BN_EPS)
            xhat = (z - mu) * inv
            y = gamma * xhat + beta
            bn = (xhat, inv, gamma)
        else:
            y = z
        hn = np.maximum(y, 0.0)
        cache.append((h, y, bn, Wm))
        h = hn
    deep = h @ p[lay.out_w:lay.out_w + lay.out_in] + p[lay.out_b]
    logits = lin + first + (second if fm else 0.0) + deep
    return logits, dict(v=v, s=s, x=x, h=h, cache=cache), after


def bce(logits, labels):
    z = logits
    return float(np.mean(np.maximum(z, 0.0) - z * labels + np.log1p(np.exp(-np.abs(z)))))


def sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def backward(lay, fm, p, dense, emb, labels):
    logits, c, after = forward(lay, fm, p, dense, emb, True)
    g = (sigmoid(logits) - labels) / B  # d loss / d logits
    grad = np.zeros(lay.n)
    grad[lay.lw:lay.lw + N_DENSE] = g @ dense
    grad[lay.lb] = g.sum()
    d_emb = np.zeros((B, F, W))
    d_emb[:, :, EMB_DIM] = g[:, None]  # the first-order weights
    if fm:
        d_emb[:, :, :EMB_DIM] += g[:, None, None] * (c["s"][:, None, :] - c["v"])
    # The output layer, then the hidden layers in reverse.
    grad[lay.out_w:lay.out_w + lay.out_in] = g @ c["h"]
    grad[lay.out_b] = g.sum()
    dh = g[:, None] * p[lay.out_w:lay.out_w + lay.out_in][None, :]
    for l in range(len(lay.layers) - 1, -1, -1):
        wo, bo, go, beo, out, inp = lay.layers[l]
        h_in, y, bn, Wm = c["cache"][l]
        dy = dh * (y > 0)
        if bn:
            xhat, inv, gamma = bn
            grad[go:go + out] = np.sum(dy * xhat, axis=0)
            grad[beo:beo + out] = np.sum(dy, axis=0)
            dxhat = dy * gamma
            dz = inv / B * (B * dxhat - dxhat.sum(axis=0) - xhat * np.sum(dxhat * xhat, axis=0))
        else:
            dz = dy
        grad[wo:wo + out * inp] = (dz.T @ h_in).ravel()
        grad[bo:bo + out] = dz.sum(axis=0)
        dh = dz @ Wm
    d_emb[:, :, :EMB_DIM] += dh[:, N_DENSE:].reshape(B, F, EMB_DIM)
    return logits, grad, d_emb, after


def fd_check(lay, fm, pooling, params, dense, table, gids, labels, grad, d_emb):
    eps = 1e-6

    def loss(p, e):
        return bce(forward(lay, fm, p, dense, e, True)[0], labels)

    emb = pool(table, gids, pooling)
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
        cmp("grad", i, (loss(up, emb) - loss(down, emb)) / (2 * eps), grad[i])
    for i in range(emb.size):
        up, down = emb.copy(), emb.copy()
        up.flat[i] += eps
        down.flat[i] -= eps
        cmp("d_emb", i, (loss(params, up) - loss(params, down)) / (2 * eps), d_emb.flat[i])
    # The table rows' gradient: d_emb scattered through the bags.
    d_table = np.zeros_like(table)
    for c in range(F):
        for b in range(B):
            ids = gids[c][b]
            for r in ids:
                d_table[r] += d_emb[b, c] / (len(ids) if pooling == 1 else 1)
    for i in range(table.size):
        up, down = table.copy(), table.copy()
        up.flat[i] += eps
        down.flat[i] -= eps
        fd = (loss(params, pool(up, gids, pooling)) - loss(params, pool(down, gids, pooling))) / (2 * eps)
        cmp("table", i, fd, d_table.flat[i])
    return worst


def make(lay, seed):
    rng = np.random.default_rng(seed)
    dense = f32(rng.normal(0.0, 1.0, size=(B, N_DENSE)))
    p = np.zeros(lay.n)
    p[lay.lw:lay.lw + N_DENSE] = rng.normal(0.0, np.sqrt(2.0 / (N_DENSE + 1)), size=N_DENSE)
    p[lay.lb] = rng.normal(0.0, 0.3)
    for wo, bo, go, beo, out, inp in lay.layers:
        p[wo:wo + out * inp] = rng.normal(0.0, np.sqrt(2.0 / (inp + out)), size=out * inp)
        p[bo:bo + out] = rng.normal(0.0, np.sqrt(1.0 / out), size=out)
        if lay.bn:
            p[go:go + out] = 1.0 + 0.2 * rng.normal(size=out)
            p[beo:beo + out] = 0.2 * rng.normal(size=out)
    p[lay.out_w:lay.out_w + lay.out_in] = rng.normal(0.0, np.sqrt(2.0 / (lay.out_in + 1)), size=lay.out_in)
    p[lay.out_b] = rng.normal(0.0, 0.3)
    # Running statistics away from their start, so that scoring tests them.
    for m, v in lay.running:
        out = v - m
        p[m:m + out] = 0.3 * rng.normal(size=out)
        p[v:v + out] = rng.uniform(0.5, 1.5, size=out)
    table = f32(rng.uniform(-0.6, 0.6, size=(sum(COL_ROWS), W)))
    return dense, f32(p), table


def well_conditioned(lay, fm, p, dense, emb):
    """No ReLU input near its kink (fp32 and float64 agree on every mask, and
    finite differences stay on one side), in training and in scoring, every
    hidden unit active on some row, and probabilities away from 0 and 1."""
    for train in (True, False):
        logits, c, _ = forward(lay, fm, p, dense, emb, train)
        for _, y, _, _ in c["cache"]:
            if np.min(np.abs(y)) < MARGIN or not (y < 0).any() or not (y > 0).any(axis=0).all():
                return False
        pr = sigmoid(logits)
        if not np.all((pr > 0.05) & (pr < 0.95)):
            return False
    return True


def write(name, fm, bn, pooling, out_dir):
    lay = Layout(bn)
    gids = global_ids()
    labels = np.array(LABELS)
    for seed in range(1, 1001):
        dense, params, table = make(lay, seed)
        if well_conditioned(lay, fm, params, dense, pool(table, gids, pooling)):
            break
    else:
        sys.exit(f"{name}: no well-conditioned seed found")
    emb = pool(table, gids, pooling)
    probs = sigmoid(forward(lay, fm, params, dense, emb, False)[0])
    logits, grad, d_emb, after = backward(lay, fm, params, dense, emb, labels)
    loss = bce(logits, labels)
    worst = fd_check(lay, fm, pooling, params, dense, table, gids, labels, grad, d_emb)
    print(f"{name}: seed {seed}: loss {loss:.6f}, {params.size} params, finite-difference check passed "
          f"(max |analytic - fd| {worst:.2e})")

    sections = Sections()
    sec = sections.add

    begins = np.cumsum([0] + COL_ROWS[:-1])
    sec("seed", "i", [seed])
    sec("n_dense", "i", [N_DENSE])
    sec("n_sparse", "i", [F])
    sec("emb_dim", "i", [EMB_DIM])
    sec("mlp", "i", MLP)
    sec("batch_norm", "i", [1 if bn else 0])
    sec("pooling", "i", [pooling])
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
    sec("probs", "f64", probs)
    sec("logits", "f64", logits)
    sec("loss", "f64", [loss])
    sec("grad", "f64", grad)
    sec("d_emb", "f64", d_emb)
    sec("state_after", "f64", after)

    header = (
        f"# dlrec golden file: a tiny {name} model's inputs, parameters, forward outputs and gradients,\n"
        "# computed in float64 by tests/golden/make_wide_deep_golden.py (NumPy, independent of dlrec);\n"
        "# read by tests/test_golden.c. Do not edit: regenerate with\n"
        "#   /usr/bin/python3 tests/golden/make_wide_deep_golden.py\n"
        "# Format: sections \"@NAME TYPE COUNT\" (TYPE i: integers, f: floats), each followed by\n"
        "# COUNT whitespace-separated values. Shapes: dense (batch, n_dense); offsetsC (batch+1)\n"
        "# and idsC (global ids) per sparse column C; table (table_rows, emb_dim + 1), the\n"
        "# first-order weight last; params flat in dlrec's layout (the script's docstring), the\n"
        "# batch norm running statistics last; grad like params; d_emb (batch, n_sparse, emb_dim + 1).\n"
        "# pooling: 0 sum, 1 mean. probs: the scoring pass (running statistics); logits, loss\n"
        "# (mean BCE), grad, d_emb: the training pass (batch statistics); state_after: params\n"
        "# after the training pass.\n"
    )
    text = sections.text(header, name)
    path = os.path.join(out_dir, f"{name}_tiny.txt")
    with open(path, "w") as f:
        f.write(text)
    print(f"wrote {path} ({len(text)} bytes)")


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    for name, fm, bn, pooling in MODELS:
        write(name, fm, bn, pooling, out_dir)


if __name__ == "__main__":
    main()
