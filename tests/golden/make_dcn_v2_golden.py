#!/usr/bin/env python3
"""Writes tests/golden/dcn_v2_*.txt: tiny DCN-v2 networks' inputs and
parameters with their forward outputs and gradients, computed in float64 by
a plain NumPy implementation written independently of dlrec
(tests/test_golden.c compares dlrec's fp32 results against it).

The model (Wang et al. 2021; TorchRec's CrossNet / LowRankMixtureCrossNet):
    x0 = [dense, e_1 .. e_F]                       pooled embeddings, sum or mean
    x_{l+1} = x0 * (x_l W_l^T + b_l) + x_l         full rank
    x_{l+1} = x0 * (sum_k p_k E_k(x_l) + b_l) + x_l  mixture of K low-rank experts,
        E_k(x) = relu(relu(x V_k^T) C_k^T) U_k^T, p = softmax_k(x G_k^T)
    stacked:  logit = output(MLP(x_L));  parallel: logit = output([x_L, MLP(x0)])
with the MLP's hidden layers Linear + ReLU, the output a Linear to 1, and
the mean binary cross-entropy on the logits. Dense parameters are flat in
dlrec's layout: per cross layer (weight (d, d), bias (d)) or (V (K r, d),
C (K r, r), U (K d, r), gate (K, d), bias (d)), then per MLP layer weight
(OUT, IN) row-major and bias (OUT), then the output layer's.

The gradients (every dense parameter, and the pooled embeddings d_emb) are
taken by complex-step differentiation, d f/d x = Im f(x + ih) / h with
h = 1e-30, which is exact to rounding for a function built from analytic
operations (ReLU is applied on the real part's sign, the softmax's shift and
the loss's branch likewise): no backward pass is written, so none is shared
with dlrec's. Central finite differences in float64 check them before the
file is written. Inputs and parameters are rounded to float32 first, so
the C test feeds dlrec exactly the values used here, and the seed is the
first from which no ReLU input lies near its kink.

Usage: /usr/bin/python3 tests/golden/make_dcn_v2_golden.py [OUTPUT_DIR]
"""
import os
import sys

import numpy as np

from golden_format import Sections, f32

N_DENSE = 3
COL_ROWS = [5, 7, 4]
EMB_DIM = 3
LABELS = [1.0, 0.0, 0.0, 1.0]
BAGS = [
    [[0], [4], [0], [2]],
    [[], [1], [3, 5], [2, 6, 2]],
    [[1], [0], [3], [2]],
]
B = len(LABELS)
F = len(COL_ROWS)
D0 = N_DENSE + F * EMB_DIM  # d, the cross network's width
MARGIN = 1e-2
H = 1e-30

# The nets: name, structure (0 stacked, 1 parallel), cross layers, rank,
# experts, MLP widths, pooling (0 sum, 1 mean).
NETS = [
    dict(name="dcn_v2_stacked_full", structure=0, layers=2, rank=0, experts=1, mlp=[5, 4], pooling=0),
    dict(name="dcn_v2_parallel_moe", structure=1, layers=2, rank=3, experts=3, mlp=[6], pooling=1),
]


def shapes(net):
    """The flat array's tensors in dlrec's order: (name, shape)."""
    d, r, K = D0, net["rank"], net["experts"]
    out = []
    for l in range(net["layers"]):
        if r == 0:
            out += [(f"cross.{l}.weight", (d, d)), (f"cross.{l}.bias", (d,))]
        else:
            out += [(f"cross.{l}.V", (K * r, d)), (f"cross.{l}.C", (K * r, r)), (f"cross.{l}.U", (K * d, r)),
                    (f"cross.{l}.gate", (K, d)), (f"cross.{l}.bias", (d,))]
    width = d
    for i, w in enumerate(net["mlp"]):
        out += [(f"mlp.{i}.weight", (w, width)), (f"mlp.{i}.bias", (w,))]
        width = w
    out_in = d + width if net["structure"] == 1 else width
    out += [("output.weight", (1, out_in)), ("output.bias", (1,))]
    return out


def unflatten(net, p):
    t, off = {}, 0
    for name, shape in shapes(net):
        n = int(np.prod(shape))
        t[name] = p[off:off + n].reshape(shape)
        off += n
    assert off == p.size
    return t


def relu(z, pres=None):
    if pres is not None:
        pres.append(z.real.copy())
    return np.where(z.real > 0, z, 0)


def forward(net, p, dense, emb, pres=None):
    """The logits (B); pres collects every ReLU input's real part."""
    t = unflatten(net, p)
    x0 = np.concatenate([dense.astype(emb.dtype), emb.reshape(B, F * EMB_DIM)], axis=1)
    x = x0
    r, K = net["rank"], net["experts"]
    for l in range(net["layers"]):
        if r == 0:
            u = x @ t[f"cross.{l}.weight"].T + t[f"cross.{l}.bias"]
        else:
            V, C, U = t[f"cross.{l}.V"], t[f"cross.{l}.C"], t[f"cross.{l}.U"]
            g = x @ t[f"cross.{l}.gate"].T  # (B, K)
            g = g - g.real.max(axis=1, keepdims=True)
            pk = np.exp(g) / np.exp(g).sum(axis=1, keepdims=True)
            u = 0
            for k in range(K):
                a = relu(x @ V[k * r:(k + 1) * r].T, pres)
                a = relu(a @ C[k * r:(k + 1) * r].T, pres)
                u = u + pk[:, k:k + 1] * (a @ U[k * D0:(k + 1) * D0].T)
            u = u + t[f"cross.{l}.bias"]
        x = x0 * u + x
    h = x0 if net["structure"] == 1 else x
    for i in range(len(net["mlp"])):
        h = relu(h @ t[f"mlp.{i}.weight"].T + t[f"mlp.{i}.bias"], pres)
    if net["structure"] == 1:
        h = np.concatenate([x, h], axis=1)
    return (h @ t["output.weight"].T + t["output.bias"])[:, 0]


def bce(z, y):
    """Mean BCE on logits, branching on the real part as |z| would."""
    pos = z.real > 0
    v = np.where(pos, z - z * y + np.log1p(np.exp(-np.where(pos, z, 0))), -z * y + np.log1p(np.exp(np.where(pos, 0, z))))
    return np.mean(v)


def global_ids():
    begins = np.cumsum([0] + COL_ROWS[:-1])
    return [[[int(begins[c]) + i for i in bag] for bag in BAGS[c]] for c in range(F)]


def pool(table, gids, pooling):
    emb = np.zeros((B, F, EMB_DIM))
    for c in range(F):
        for b in range(B):
            for r in gids[c][b]:
                emb[b, c] += table[r]
            if pooling == 1 and gids[c][b]:
                emb[b, c] /= len(gids[c][b])
    return emb


def complex_step(f, x):
    g = np.zeros(x.size)
    for i in range(x.size):
        xc = x.astype(complex).ravel()
        xc[i] += 1j * H
        g[i] = f(xc.reshape(x.shape)).imag / H
    return g.reshape(x.shape)


def make(net, seed):
    rng = np.random.default_rng(seed)
    dense = f32(rng.normal(0.0, 1.0, size=(B, N_DENSE)))
    parts = []
    for name, shape in shapes(net):
        fan = shape[-1] + shape[0] if len(shape) == 2 else shape[0]
        std = np.sqrt(2.0 / fan) if len(shape) == 2 else 0.3
        parts.append(rng.normal(0.0, std, size=int(np.prod(shape))))
    params = f32(np.concatenate(parts))
    table = f32(rng.uniform(-0.8, 0.8, size=(sum(COL_ROWS), EMB_DIM)))
    return dense, params, table


def well_conditioned(net, params, dense, emb):
    pres = []
    z = forward(net, params, dense, emb, pres)
    # An exact 0 is an expert's second ReLU on a row whose first ReLU is all
    # off (there is no bias): 0 in fp32 too, and no perturbation moves it.
    if any(((np.abs(a) < MARGIN) & (a != 0)).any() for a in pres):
        return False
    p = 1 / (1 + np.exp(-z))
    return bool(np.all((p > 0.05) & (p < 0.95)))


def write(net, out_dir):
    gids = global_ids()
    labels = np.array(LABELS)
    for seed in range(1, 1000):
        dense, params, table = make(net, seed)
        emb = pool(table, gids, net["pooling"])
        if well_conditioned(net, params, dense, emb):
            break
    else:
        sys.exit("no well-conditioned seed found")
    logits = forward(net, params, dense, emb)
    probs = 1 / (1 + np.exp(-logits))
    loss = float(bce(logits, labels))
    grad = complex_step(lambda p: bce(forward(net, p, dense, emb), labels), params)
    d_emb = complex_step(lambda e: bce(forward(net, params, dense, e), labels), emb)
    # Central finite differences in float64 agree with the complex step.
    eps, worst = 1e-6, 0.0
    for x, g, f in ((params, grad, lambda p: bce(forward(net, p, dense, emb), labels)),
                    (emb, d_emb, lambda e: bce(forward(net, params, dense, e), labels))):
        for i in range(x.size):
            up, down = x.copy(), x.copy()
            up.flat[i] += eps
            down.flat[i] -= eps
            fd = (f(up) - f(down)) / (2 * eps)
            err = abs(fd - g.flat[i])
            worst = max(worst, err)
            if err > 1e-7 + 1e-5 * abs(fd):
                sys.exit(f"{net['name']}: finite differences disagree at {i}: {fd!r} vs {g.flat[i]!r}")
    print(f"{net['name']}: seed {seed}, loss {loss:.6f}, {params.size} params, max |complex step - fd| {worst:.2e}")

    sections = Sections()
    sec = sections.add

    begins = np.cumsum([0] + COL_ROWS[:-1])
    sec("seed", "i", [seed])
    sec("n_dense", "i", [N_DENSE])
    sec("n_sparse", "i", [F])
    sec("emb_dim", "i", [EMB_DIM])
    sec("structure", "i", [net["structure"]])
    sec("cross_layers", "i", [net["layers"]])
    sec("low_rank", "i", [net["rank"]])
    sec("experts", "i", [net["experts"]])
    sec("mlp", "i", net["mlp"])
    sec("pooling", "i", [net["pooling"]])
    sec("batch", "i", [B])
    sec("table_rows", "i", [sum(COL_ROWS)])
    sec("id_ranges", "i", [v for c in range(F) for v in (begins[c], begins[c] + COL_ROWS[c])])
    sec("max_hotness", "i", [max(len(bag) for bag in BAGS[c]) for c in range(F)])
    sec("dense", "f32", dense)
    sec("labels", "f32", labels)
    for c in range(F):
        sec(f"offsets{c}", "i", np.cumsum([0] + [len(bag) for bag in gids[c]]))
        sec(f"ids{c}", "i", [r for bag in gids[c] for r in bag])
    sec("table", "f32", table)
    sec("params", "f32", params)
    sec("logits", "f64", logits)
    sec("probs", "f64", probs)
    sec("loss", "f64", [loss])
    sec("grad", "f64", grad)
    sec("d_emb", "f64", d_emb)
    header = (
        f"# dlrec golden file: a tiny DCN-v2 ({net['name']}): inputs, parameters, forward outputs and\n"
        "# gradients, computed in float64 by tests/golden/make_dcn_v2_golden.py (NumPy, independent of\n"
        "# dlrec); read by tests/test_golden.c. Do not edit: regenerate with\n"
        "#   /usr/bin/python3 tests/golden/make_dcn_v2_golden.py\n"
        "# Format as dlrm_tiny.txt. structure: 0 stacked, 1 parallel; low_rank 0: full rank. params\n"
        "# flat in dlrec's tensor order (make_dcn_v2_golden.py: shapes()); grad like params; d_emb\n"
        "# (batch, n_sparse, emb_dim). pooling: 0 sum, 1 mean. loss: mean BCE on logits.\n"
    )
    text = sections.text(header, "dcn_v2")
    path = os.path.join(out_dir, net["name"] + ".txt")
    with open(path, "w") as f:
        f.write(text)
    print(f"wrote {path} ({len(text)} bytes)")


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    for net in NETS:
        write(net, out_dir)


if __name__ == "__main__":
    main()
