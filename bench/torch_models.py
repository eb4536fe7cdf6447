#!/usr/bin/python3
"""PyTorch peers of dlrec's model types, which bench/models_vs_torch.sh trains beside `dlrec train`.

It reads the same dlrec config (docs/config.md) as `dlrec train`: its
`model` section picks the type and shape, its `optimizer` section the dense
and sparse optimizers, so both sides run one definition. Types and shapes
(F categorical columns, D = model.embedding_dim, dense = the n_dense dense
features, e_f / v_f the embedding of column f's id, w_f its first-order
weight):

  - lr:        logit = bias + w·dense + Σ_f w_f                (table width 1)
  - fm:        logit = linear(dense) + Σ_f w_f + Σ_{f<g} <v_f, v_g>
               (table width D + 1: v_f the first D coordinates, w_f the last)
  - dlrm:      bench/torch_dlrm.py's DLRM: bottom MLP (ReLU after each layer)
               to x, dot interaction [x, pairs of [x, e_1..e_F]] (or "cat"),
               top MLP (ReLU but the last)
  - wide_deep: table D + 1 as fm; logit = linear(dense) + Σ_f w_f
               + MLP([dense, v_1..v_F])
  - deepfm:    wide_deep + the FM term of fm
  - dnn:       table D; logit = MLP([dense, e_1..e_F])
  - dcn_v2:    table D; x0 = [dense, e_1..e_F] (width d); "stacked":
               cross layers -> MLP -> linear 1; "parallel": [cross(x0),
               MLP(x0)] -> linear 1. Cross layer x_{l+1} = x0 ⊙ (W x_l + b)
               + x_l with W full (d x d), low rank (U V, `low_rank` r), or
               with `experts` K > 1 TorchRec's LowRankMixtureCrossNet (a
               softmax gate over K low-rank experts U_k g(C_k g(V_k x_l)),
               g = --mix-activation, default relu as src/backend/cpu/cross_mix.c)
  where MLP is `model.mlp` hidden layers of Linear -> [BatchNorm1d if
  `batch_norm`] -> ReLU -> [Dropout(`dropout`)] and a final linear to 1
  (dlrm's MLPs are its bottom_mlp and top_mlp, the top one's hidden layers
  with `top_mlp_batch_norm` and `top_mlp_dropout`).

All embeddings live in ONE table of (table_rows, width) with the .dlr file's
global ids (id_begin of each column added back), as dlrec's does, looked up
with F.embedding(sparse=True), so that a step's sparse gradient is one
sparse tensor for all columns.

Initialization, as dlrec's (src/backend/table.c, src/model/*.c): each column's
rows uniform in ±sqrt(1 / rows of that column); MLP and final linear layers
weights normal with std sqrt(2 / (in + out)) (Xavier normal), biases normal
with std sqrt(1 / out) (the DLRM reference's); the dense first-order term
weights Xavier normal, bias 0; cross layer matrices (W, U, V, C, the gates)
Xavier normal, cross biases 0; batch norm gamma 1, beta 0.

Optimizers, with PyTorch's definitions as dlrec's are: dense sgd, adam or
adagrad (torch.optim); sparse (touched rows only, the rows' gradients summed
over the batch first): sgd, rowwise_adagrad (FBGEMM's exact row-wise
Adagrad: one accumulator per row fed with the row's mean squared gradient)
and lazy_adam (Adam on touched rows with each row's own step count in the
bias correction), written here over the coalesced sparse gradient, as
src/backend/cpu/sparse_update.c does. Loss BCEWithLogitsLoss (mean).

--check CKPT (and --init-from CKPT) load a dlrec checkpoint: its table, and
its dense tensors matched in order, by shape, to this model's parameters,
which are registered in this order (weights (out, in) before biases):
  - lr, fm: linear.weight (1, n_dense), linear.bias (1), or bias (1) alone;
  - wide_deep, deepfm: that dense term, then the MLP's layers, the last (1, ..);
  - dlrm: the bottom MLP's layers, then the top MLP's;
  - dcn_v2: per cross layer W (d, d) and b (d), or low rank V (r, d), U (d, r),
    b (d), or the mixture v (K·r, d), c (K·r, r), u (K·d, r), gates (K, d),
    b (d); then the MLP's layers; then the final linear layer (1, ..).
A checkpoint whose tensors do not line up is refused, naming both lists.

Data, shuffling and timing as bench/torch_dlrm.py (whose reader and batch
stream this uses): the training loop, data reading included, is timed;
evaluation is not. Prints one JSON line:
  {"engine":"pytorch","model":..,"batch":B,"threads":N,"samples_per_s":..,"auc":..,"logloss":..,...}
"""

import argparse
import json
import math
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_dlrm import Dlr, auc_exact, batches  # noqa: E402  (the shared .dlr reader and batch stream)


# ---- initialization ------------------------------------------------------------

def xavier_(w):
    """Normal with std sqrt(2 / (fan_in + fan_out)) for a (out, in) matrix."""
    out, inp = w.shape
    with torch.no_grad():
        w.normal_(0.0, math.sqrt(2.0 / (out + inp)))
    return w


def linear(n, m, bias="mlp"):
    """nn.Linear(n, m); bias "mlp": N(0, sqrt(1/m)) (DLRM's), "zero", or None (no bias)."""
    lin = nn.Linear(n, m, bias=bias is not None)
    xavier_(lin.weight)
    if bias is not None:
        with torch.no_grad():
            if bias == "mlp":
                lin.bias.normal_(0.0, math.sqrt(1.0 / m))
            else:
                lin.bias.zero_()
    return lin


def mlp(widths, last_relu, dropout=0.0, batch_norm=False):
    """Linear layers widths[0] -> .. -> widths[-1]; each but (unless last_relu) the last is
    followed by [BatchNorm1d] -> ReLU -> [Dropout]."""
    layers = []
    for i in range(len(widths) - 1):
        layers.append(linear(widths[i], widths[i + 1]))
        if i < len(widths) - 2 or last_relu:
            if batch_norm:
                layers.append(nn.BatchNorm1d(widths[i + 1]))
            layers.append(nn.ReLU())
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
    return nn.Sequential(*layers)


# ---- blocks --------------------------------------------------------------------

class DenseTerm(nn.Module):
    """The first-order term on the dense features: linear(dense) -> (B,), or a lone bias."""

    def __init__(self, n_dense):
        super().__init__()
        self.n_dense = n_dense
        if n_dense:
            self.lin = linear(n_dense, 1, bias="zero")
        else:
            self.bias = nn.Parameter(torch.zeros(1))

    def forward(self, dense):
        if self.n_dense:
            return self.lin(dense).squeeze(1)
        return self.bias.expand(dense.shape[0])


def fm_second_order(v):
    """Σ_{f<g} <v_f, v_g> for v (B, F, D): ((Σ v)^2 - Σ v^2) / 2 summed over D -> (B,)."""
    s = v.sum(1)
    return 0.5 * (s * s - (v * v).sum(1)).sum(1)


class Cross(nn.Module):
    """One DCN-v2 cross layer: x0 ⊙ (W xl + b) + xl, W full (d x d) or low rank (U V). The
    weights are parameters of this module, registered in dlrec's tensor order (cross.l.weight,
    or cross.l.V then cross.l.U, then cross.l.bias), so a checkpoint maps onto them."""

    def __init__(self, d, rank):
        super().__init__()
        def xavier(out, inp):
            return nn.Parameter(torch.randn(out, inp) * math.sqrt(2.0 / (out + inp)))
        if rank:
            self.v = xavier(rank, d)
            self.u = xavier(d, rank)
        else:
            self.w = xavier(d, d)
        self.rank = rank
        self.b = nn.Parameter(torch.zeros(d))

    def forward(self, x0, xl):
        y = (xl @ self.v.t()) @ self.u.t() if self.rank else xl @ self.w.t()
        return x0 * (y + self.b) + xl


class CrossMix(nn.Module):
    """TorchRec's LowRankMixtureCrossNet layer: x0 ⊙ Σ_k p_k (U_k g(C_k g(V_k xl)) + b) + xl,
    p = softmax_k(G xl). The experts' matrices lie back to back as src/backend/cpu/cross_mix.c keeps
    them (v (K·r, d), c (K·r, r), u (K·d, r), then the gates G (K, d) and the shared bias b),
    and the K experts run as batched products."""

    def __init__(self, d, rank, experts, act):
        super().__init__()
        K, r = experts, rank
        self.K, self.r, self.d, self.act = K, r, d, act
        self.v = nn.Parameter(torch.empty(K * r, d))
        self.c = nn.Parameter(torch.empty(K * r, r))
        self.u = nn.Parameter(torch.empty(K * d, r))
        self.g = nn.Parameter(torch.empty(K, d))
        self.b = nn.Parameter(torch.zeros(d))
        with torch.no_grad():  # Xavier normal per expert's matrix, and per expert's gate (d -> 1)
            self.v.normal_(0.0, math.sqrt(2.0 / (r + d)))
            self.c.normal_(0.0, math.sqrt(2.0 / (r + r)))
            self.u.normal_(0.0, math.sqrt(2.0 / (d + r)))
            self.g.normal_(0.0, math.sqrt(2.0 / (d + 1)))

    def forward(self, x0, xl):
        K, r, d = self.K, self.r, self.d
        t1 = self.act(torch.matmul(xl, self.v.view(K, r, d).transpose(1, 2)))  # (K, B, r)
        t2 = self.act(torch.matmul(t1, self.c.view(K, r, r).transpose(1, 2)))  # (K, B, r)
        e = torch.matmul(t2, self.u.view(K, d, r).transpose(1, 2))  # (K, B, d)
        p = torch.softmax(xl @ self.g.t(), dim=1)  # (B, K)
        m = (p.t().unsqueeze(2) * e).sum(0)  # (B, d); Σ_k p_k = 1 carries b out of the sum
        return x0 * (m + self.b) + xl


# ---- models --------------------------------------------------------------------

# The dlrec model types this file has a twin of (bench/models_vs_torch.sh asks, with --twins).
TWINS = ("lr", "fm", "dlrm", "wide_deep", "deepfm", "dcn_v2", "dnn")


class Model(nn.Module):
    """One model type over one embedding table; forward(dense (B, n_dense), ids (B, F) global) -> logits (B,)."""

    def __init__(self, m, n_dense, cols, mix_act):
        super().__init__()
        t = m.get("type", "dlrm")
        self.type = t
        if t not in TWINS:
            raise SystemExit(f"torch_models: model.type '{t}' is not one of {', '.join(sorted(TWINS))}")
        if m.get("pooling", "sum") != "sum":
            raise SystemExit("torch_models: only sum pooling (one-hot data pools alike either way)")
        D = int(m.get("embedding_dim", 16))
        self.F, self.D, self.n_dense = len(cols), D, n_dense
        width = {"lr": 1, "fm": D + 1, "wide_deep": D + 1, "deepfm": D + 1}.get(t, D)
        self.width = width
        rows = cols[-1][1]
        self.table = nn.Parameter(torch.empty(rows, width))
        with torch.no_grad():
            for b, e in cols:
                a = math.sqrt(1.0 / (e - b))
                self.table[b:e].uniform_(-a, a)
        drop, bn = float(m.get("dropout", 0.0)), bool(m.get("batch_norm", False))
        hidden = [int(x) for x in m.get("mlp", [400, 400, 400])]
        if t in ("lr", "fm", "wide_deep", "deepfm"):
            self.dense_term = DenseTerm(n_dense)
        if t in ("wide_deep", "deepfm", "dnn"):
            self.deep = mlp([n_dense + self.F * D] + hidden + [1], False, drop, bn)
        elif t == "dlrm":
            bottom = [int(x) for x in m.get("bottom_mlp", [512, 256, 64, 16])]
            top = [int(x) for x in m.get("top_mlp", [512, 256, 1])]
            self.cat = m.get("interaction", "dot") == "cat"
            if not n_dense:
                raise SystemExit("torch_models: dlrm here needs dense columns")
            self.bot = mlp([n_dense] + bottom, True)
            nf = self.F + 1
            li, lj = torch.tril_indices(nf, nf, offset=-1)
            self.register_buffer("li", li, persistent=False)
            self.register_buffer("lj", lj, persistent=False)
            inter = D + (self.F * D if self.cat else nf * (nf - 1) // 2)
            self.top = mlp([inter] + top, False, float(m.get("top_mlp_dropout", 0.0)),
                           bool(m.get("top_mlp_batch_norm", False)))
        elif t == "dcn_v2":
            d = n_dense + self.F * D
            self.structure = m.get("structure", "stacked")
            if self.structure not in ("stacked", "parallel"):
                raise SystemExit(f"torch_models: model.structure '{self.structure}' is not stacked or parallel")
            rank, experts = int(m.get("low_rank", 0)), int(m.get("experts", 1))
            act = {"relu": torch.relu, "none": lambda x: x}[mix_act]
            n = int(m.get("cross_layers", 3))
            if experts > 1:
                if not rank:
                    raise SystemExit("torch_models: experts > 1 needs low_rank")
                self.cross = nn.ModuleList(CrossMix(d, rank, experts, act) for _ in range(n))
            else:
                self.cross = nn.ModuleList(Cross(d, rank) for _ in range(n))
            if self.structure == "stacked":
                self.deep = mlp([d] + hidden, True, drop, bn)
                self.final = linear(hidden[-1], 1)
            else:
                self.deep = mlp([d] + hidden, True, drop, bn)
                self.final = linear(d + hidden[-1], 1)

    def forward(self, dense, ids):
        e = F.embedding(ids, self.table, sparse=True)  # (B, F, width)
        t = self.type
        if t == "lr":
            return self.dense_term(dense) + e.squeeze(2).sum(1)
        if t in ("fm", "wide_deep", "deepfm"):
            v, w = e[:, :, :self.D], e[:, :, self.D]
            z = self.dense_term(dense) + w.sum(1)
            if t != "wide_deep":
                z = z + fm_second_order(v)
            if t != "fm":
                z = z + self.deep(torch.cat([dense, v.reshape(v.shape[0], -1)], 1)).squeeze(1)
            return z
        if t == "dnn":
            return self.deep(torch.cat([dense, e.reshape(e.shape[0], -1)], 1)).squeeze(1)
        if t == "dlrm":
            x = self.bot(dense)
            if self.cat:
                return self.top(torch.cat([x, e.reshape(e.shape[0], -1)], 1)).squeeze(1)
            zz = torch.cat([x.unsqueeze(1), e], 1)  # (B, F + 1, D)
            z = torch.bmm(zz, zz.transpose(1, 2))
            return self.top(torch.cat([x, z[:, self.li, self.lj]], 1)).squeeze(1)
        # dcn_v2
        x0 = torch.cat([dense, e.reshape(e.shape[0], -1)], 1)
        xl = x0
        for c in self.cross:
            xl = c(x0, xl)
        if self.structure == "stacked":
            return self.final(self.deep(xl)).squeeze(1)
        return self.final(torch.cat([xl, self.deep(x0)], 1)).squeeze(1)


# ---- optimizers ----------------------------------------------------------------

def dense_optimizer(params, c):
    kind = c.get("type", "sgd")
    lr, wd = float(c.get("lr", 0.1)), float(c.get("weight_decay", 0.0))
    if kind == "sgd":
        return torch.optim.SGD(params, lr=lr, weight_decay=wd)
    if kind == "adam":
        return torch.optim.Adam(params, lr=lr, betas=(float(c.get("beta1", 0.9)), float(c.get("beta2", 0.999))),
                                eps=float(c.get("eps", 1e-8)), weight_decay=wd)
    if kind == "adagrad":
        return torch.optim.Adagrad(params, lr=lr, eps=float(c.get("eps", 1e-10)), weight_decay=wd,
                                   initial_accumulator_value=float(c.get("initial_accumulator", 0.0)))
    raise SystemExit(f"torch_models: optimizer.dense.type '{kind}' is not one of sgd, adam, adagrad")


class SparseOptimizer:
    """dlrec's sparse optimizers on the table's sparse gradient (touched rows only)."""

    def __init__(self, table, c):
        self.w = table
        self.kind = c.get("type", "sgd")
        self.lr, self.wd = float(c.get("lr", 0.1)), float(c.get("weight_decay", 0.0))
        rows = table.shape[0]
        if self.kind == "rowwise_adagrad":
            self.eps = float(c.get("eps", 1e-10))
            self.acc = torch.full((rows,), float(c.get("initial_accumulator", 0.0)))
        elif self.kind == "lazy_adam":
            self.eps = float(c.get("eps", 1e-8))
            self.b1, self.b2 = float(c.get("beta1", 0.9)), float(c.get("beta2", 0.999))
            self.m = torch.zeros_like(table)
            self.v = torch.zeros_like(table)
            self.t = torch.zeros(rows, dtype=torch.float64)
        elif self.kind != "sgd":
            raise SystemExit(f"torch_models: optimizer.sparse.type '{self.kind}' is not one of sgd, "
                             "rowwise_adagrad, lazy_adam")

    @torch.no_grad()
    def step(self):
        g = self.w.grad.coalesce()  # one row per touched id, its gradients summed
        self.w.grad = None
        idx, gv = g.indices()[0], g.values()
        w = self.w.data
        if self.wd:
            gv = gv + self.wd * w[idx]
        if self.kind == "sgd":
            w.index_add_(0, idx, gv, alpha=-self.lr)
        elif self.kind == "rowwise_adagrad":
            acc = self.acc[idx] + gv.pow(2).mean(1)
            self.acc[idx] = acc
            w.index_add_(0, idx, gv / (acc.sqrt() + self.eps).unsqueeze(1), alpha=-self.lr)
        else:
            t = self.t[idx] + 1
            self.t[idx] = t
            m = self.m[idx].mul_(self.b1).add_(gv, alpha=1 - self.b1)
            v = self.v[idx].mul_(self.b2).addcmul_(gv, gv, value=1 - self.b2)
            self.m[idx], self.v[idx] = m, v
            bc1 = (1 - torch.pow(self.b1, t)).float().unsqueeze(1)
            bc2 = (1 - torch.pow(self.b2, t)).float().unsqueeze(1)
            w.index_add_(0, idx, (self.lr / bc1) * m / (v.sqrt() / bc2.sqrt() + self.eps), alpha=-1.0)


# ---- the check against dlrec's own forward ---------------------------------------

def read_tensors(path):
    """The arrays of a dlrec tensor file (docs/formats.md, "Tensor files"): {name: np.ndarray}."""
    raw = open(path, "rb").read()
    if raw[:8] != b"DLRTNSR1":
        raise SystemExit(f"{path}: not a dlrec tensor file")
    version, n, size = struct.unpack_from("<IIQ", raw, 8)
    if version != 1 or size != len(raw):
        raise SystemExit(f"{path}: tensor file version {version}, {size} bytes declared, {len(raw)} read")
    out = {}
    for i in range(n):
        name, dtype, _crc, count, off = struct.unpack_from("<40sIIQQ", raw, 32 + 64 * i)
        out[name.rstrip(b"\0").decode()] = np.frombuffer(raw, dtype=np.float32 if dtype == 1 else np.uint32,
                                                         count=count, offset=off)
    return out


def load_checkpoint(model, ckpt):
    """Loads a dlrec checkpoint's (or run directory's newest checkpoint's) parameters into model: the table from table.bin (its first
    `width` floats of each padded row) and the dense tensors from dense.bin, matched to the
    model's dense parameters in order by shape (dlrec's flat-array order and the registration
    order here are both input-to-output). Returns the matched (dlrec name, torch name) pairs."""
    latest = os.path.join(ckpt, "latest")
    if os.path.isfile(latest):  # a run directory: its newest checkpoint
        ckpt = os.path.join(ckpt, open(latest).read().strip())
    man = json.load(open(os.path.join(ckpt, "manifest.json")))
    dense, table = read_tensors(os.path.join(ckpt, "dense.bin")), read_tensors(os.path.join(ckpt, "table.bin"))
    rows, width = model.table.shape
    t = table["table"]
    if t.size % rows or t.size // rows < width:
        raise SystemExit(f"{ckpt}: table of {t.size} floats does not hold {rows} rows of {width}")
    mine = [(n, p) for n, p in model.named_parameters() if n != "table"]
    theirs = man["model"]["tensors"]
    if any(isinstance(m, nn.BatchNorm1d) for m in model.modules()):
        raise SystemExit("torch_models: --check does not map batch-norm statistics; check without batch_norm")
    shapes = lambda xs: [tuple(x) for x in xs]  # noqa: E731
    if len(mine) != len(theirs) or shapes(x["shape"] for x in theirs) != shapes(
            [p.shape[0]] if p.dim() == 1 else list(p.shape) for _, p in mine):
        raise SystemExit("torch_models: cannot map the checkpoint's tensors onto this model:\n  dlrec:   "
                         + " ".join(f"{x['name']}{x['shape']}" for x in theirs) + "\n  pytorch: "
                         + " ".join(f"{n}{list(p.shape)}" for n, p in mine))
    with torch.no_grad():
        model.table.copy_(torch.from_numpy(t.reshape(rows, -1)[:, :width].copy()))
        for (n, p), x in zip(mine, theirs):
            p.copy_(torch.from_numpy(dense[x["name"]].copy()).view_as(p))
    return [(x["name"], n) for (n, _), x in zip(mine, theirs)]


# ---- main ----------------------------------------------------------------------

def check(a, model, va, begins):
    """Both engines' probabilities for the same parameters: the two models are the same function
    when they agree to float rounding."""
    pairs = load_checkpoint(model, a.check)
    model.eval()
    ps = []
    with torch.no_grad():
        for _lab, dense, ids in batches(va, a.eval_batch, False, None, 1, 1):
            ps.append(torch.sigmoid(model(torch.from_numpy(dense), torch.from_numpy(ids) + begins)).double().numpy())
    p = np.concatenate(ps)
    q = np.loadtxt(a.scores, dtype=np.float64, ndmin=1)
    if q.shape != p.shape:
        raise SystemExit(f"torch_models: {a.scores} has {q.shape[0]} scores for {p.shape[0]} rows")
    diff = float(np.max(np.abs(p - q)))
    print(json.dumps({"model": model.type, "rows": int(p.shape[0]), "max_abs_diff": diff,
                      "tolerance": a.tolerance, "tensors": len(pairs), "ok": diff <= a.tolerance}))
    return 0 if diff <= a.tolerance else 1


def main():
    if sys.argv[1:] == ["--twins"]:
        print(" ".join(TWINS))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--twins", action="store_true", help="print the model types this file has a twin of, and exit")
    ap.add_argument("--config", required=True, help="the dlrec config (its model and optimizer sections)")
    ap.add_argument("--train", required=True)
    ap.add_argument("--valid", required=True)
    ap.add_argument("--batch", type=int, default=0, help="rows per step (default: the config's training.batch_size)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-rows", type=int, default=0, help="train on at most this many rows (0: all)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-shuffle", action="store_true")
    ap.add_argument("--mix-activation", choices=("relu", "none"), default="relu",
                    help="g of dcn_v2's mixture of experts (src/backend/cpu/cross_mix.c uses relu)")
    ap.add_argument("--eval-batch", type=int, default=4096)
    ap.add_argument("--bf16", action="store_true",
                    help="train under torch.autocast('cpu', torch.bfloat16) (dlrec's training.precision bf16)")
    ap.add_argument("--check", metavar="CKPT",
                    help="no training: load this dlrec checkpoint and compare the probabilities on --valid "
                         "with --scores (what `dlrec predict` wrote for it)")
    ap.add_argument("--scores", help="with --check: dlrec predict's output on --valid")
    ap.add_argument("--init-from", metavar="CKPT",
                    help="start from this dlrec checkpoint's parameters instead of this script's own init")
    ap.add_argument("--tolerance", type=float, default=1e-4, help="with --check: largest |p_dlrec - p_torch|")
    a = ap.parse_args()

    cfg = json.load(open(a.config))
    batch = a.batch or int(cfg.get("training", {}).get("batch_size", 128))
    loader = cfg.get("loader", {})
    shuffle = not a.no_shuffle and loader.get("shuffle", True)
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    rng = np.random.default_rng(a.seed)
    tr, va = Dlr(a.train), Dlr(a.valid)
    if va.cols != tr.cols or va.n_dense != tr.n_dense:
        raise SystemExit(f"torch_models: {a.valid} was not encoded with the ETL of {a.train} (other columns)")
    model = Model(cfg.get("model", {}), tr.n_dense, tr.cols, a.mix_activation)
    opt_cfg = cfg.get("optimizer", {})
    dense_params = [p for n, p in model.named_parameters() if n != "table"]
    dopt = dense_optimizer(dense_params, opt_cfg.get("dense", {}))
    sopt = SparseOptimizer(model.table, opt_cfg.get("sparse", {}))
    lossf = nn.BCEWithLogitsLoss()
    begins = torch.tensor([b for b, _ in tr.cols], dtype=torch.int64)

    if a.check:
        return check(a, model, va, begins)
    if a.init_from:
        load_checkpoint(model, a.init_from)

    model.train()
    samples = steps = 0
    loss = None
    t0 = time.perf_counter()
    for lab, dense, ids in batches(tr, batch, shuffle, rng, int(loader.get("window_groups", 8)),
                                   int(loader.get("slice_rows", 32)), a.max_rows):
        y = torch.from_numpy(lab)
        xd = torch.from_numpy(dense)
        xi = torch.from_numpy(ids) + begins  # back to the file's global ids: one table
        dopt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
            loss = lossf(model(xd, xi).float(), y)
        loss.backward()
        dopt.step()
        sopt.step()
        samples += lab.shape[0]
        steps += 1
    train_s = time.perf_counter() - t0
    train_loss = float(loss.item()) if steps else float("nan")

    model.eval()
    ys, zs = [], []
    with torch.no_grad():
        for lab, dense, ids in batches(va, a.eval_batch, False, rng, 1, 1):
            xi = torch.from_numpy(ids) + begins
            zs.append(model(torch.from_numpy(dense), xi).double().numpy())
            ys.append(lab.astype(np.float64))
    y = np.concatenate(ys)
    z = np.concatenate(zs)
    logloss = float(np.mean(np.logaddexp(0.0, z) - y * z))
    auc = auc_exact(y, z)
    calibration = float(np.mean(1.0 / (1.0 + np.exp(-z))) / np.mean(y))
    n_dense_params = sum(p.numel() for n, p in model.named_parameters() if n != "table")
    print(json.dumps({
        "engine": "pytorch", "model": model.type, "batch": batch, "threads": a.threads,
        "samples_per_s": samples / train_s if train_s > 0 else 0.0,
        "auc": auc, "logloss": logloss, "calibration": calibration,
        "samples": samples, "steps": steps, "seconds": train_s, "train_loss_last_batch": train_loss,
        "valid_rows": int(y.shape[0]), "dense_params": n_dense_params, "torch": torch.__version__,
        "bf16": a.bf16,
    }))
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
