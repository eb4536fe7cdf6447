#!/usr/bin/env python3
"""dlrec's table-wide embedding updates against NumPy (tests/optim_ref/run.sh).

Model type lr: logit = bias + sum over the columns of w[id] (an embedding of
width 1), mean binary cross-entropy over the batch, so the gradient of a
row's weight is the sum over its lookups of (sigmoid(logit) - label) / B.
Every configuration trains 6 steps of 32 rows in file order (loader.shuffle
false), checkpointing after each; NumPy starts from the first checkpoint's
table, optimizer state and bias and repeats steps 2 to 6 as PyTorch does
over a dense gradient of the whole table, checking every checkpoint:

  adam       torch.optim.Adam (its _single_tensor_adam): every row every
             step, g = dense grad (+ wd w), m.lerp_(g, 1 - b1),
             v = b2 v + (1 - b2) g^2, w -= lr / (1 - b1^t) * m /
             (sqrt(v) / sqrt(1 - b2^t) + eps), t the global step;
  sgd        w -= lr (g + wd w) on every row;
  rowwise_adagrad  a += mean(g^2) over the row; w -= lr g / (sqrt(a) + eps);
  lazy_adam  with l2_scope table and wd > 0 every row has a gradient every
             step: the same as adam.

The L2 term wd w is on every row with l2_scope "table", on the batch's rows
only with "touched". The dense part (the bias) is plain SGD.
"""
import argparse
import json
import os
import struct
import subprocess
import sys

import numpy as np

STEPS, BATCH = 6, 32
DENSE_LR = 0.05
B1, B2 = float(np.float32(0.9)), float(np.float32(0.999))  # as the config's floats hold them


def die(msg):
    print(f"optim_ref: {msg}", file=sys.stderr)
    sys.exit(1)


def read_tensors(path):
    """A tensor file (docs/formats.md, "Tensor files"): name -> array."""
    with open(path, "rb") as f:
        data = f.read()
    magic, _version, n, size = struct.unpack_from("<8sIIQ", data, 0)
    if magic != b"DLRTNSR1" or size != len(data):
        die(f"{path}: not a tensor file")
    kinds = {1: np.float32, 2: np.uint32}
    out = {}
    for i in range(n):
        name, dtype, _crc, count, offset = struct.unpack_from("<40sIIQQ", data, 32 + 64 * i)
        if dtype not in kinds:
            die(f"{path}: array of dtype {dtype}: the test trains fp32 tables")
        out[name.rstrip(b"\0").decode()] = np.frombuffer(data, kinds[dtype], count, offset).copy()
    return out


def write_csv(path, rows, seed):
    """label + three categorical columns of skewed values; some values only
    appear after the rows the 6 steps read (their rows are never touched)."""
    rng = np.random.default_rng(seed)
    cards = {"a": 40, "b": 120, "c": 6}
    with open(path, "w") as f:
        f.write("click,a,b,c\n")
        for r in range(rows):
            vals = {k: int(card * rng.random() ** 2) for k, card in cards.items()}
            if r >= STEPS * BATCH:
                vals["b"] += 1000  # only later: never looked up in the steps checked
            click = int(rng.random() < 0.2 + 0.5 * (vals["a"] % 3 == 0))
            f.write(f"{click},a{vals['a']},b{vals['b']},c{vals['c']}\n")


def run(bin_, *args):
    p = subprocess.run([bin_, *args], capture_output=True, text=True)
    if p.returncode != 0:
        die(f"dlrec {' '.join(args)}: exit {p.returncode}\n{p.stdout}{p.stderr}")
    return p.stdout


def batches(bin_, dlr):
    """Each step's (ids (B, F), labels (B)) in file order."""
    info = json.loads(run(bin_, "inspect", dlr, "--json", "-q", "--head", str(STEPS * BATCH)))
    names = [s["name"] for s in info["sparse"]]
    head = info["head"]
    out = []
    for s in range(STEPS):
        rows = head[s * BATCH:(s + 1) * BATCH]
        ids = np.array([[r["sparse"][n][0] for n in names] for r in rows], dtype=np.int64)
        out.append((ids, np.array([r["label"] for r in rows], dtype=np.float64)))
    return out, info["table_rows"]


class State:
    """The table's weights (rows), the optimizer's state and the bias, in double."""

    def __init__(self, ckpt, table_rows):
        t = read_tensors(os.path.join(ckpt, "table.bin"))["table"]
        stride = t.size // table_rows
        self.w = t.reshape(table_rows, stride)[:, 0].astype(np.float64)
        o = read_tensors(os.path.join(ckpt, "optim.bin"))
        self.m = o["sparse_m"].reshape(table_rows, -1)[:, 0].astype(np.float64) if "sparse_m" in o else None
        self.v = o["sparse_v"].reshape(table_rows, -1)[:, 0].astype(np.float64) if "sparse_v" in o else None
        self.steps = o.get("sparse_steps")
        self.accum = o["sparse_accum"].astype(np.float64) if "sparse_accum" in o else None
        self.bias = float(read_tensors(os.path.join(ckpt, "dense.bin"))["bias"][0])


def step(s, cfg, ids, labels, t):
    """Step t (from 1) of PyTorch over the dense gradient of the table."""
    sp = cfg["optimizer"]["sparse"]
    kind, lr, wd = sp["type"], float(np.float32(sp["lr"])), float(np.float32(sp.get("weight_decay", 0)))
    table = sp.get("l2_scope", "touched") == "table"
    B = len(labels)
    logit = s.bias + s.w[ids].sum(axis=1)
    d = (1 / (1 + np.exp(-logit)) - labels) / B
    g = np.zeros_like(s.w)
    np.add.at(g, ids.ravel(), np.repeat(d, ids.shape[1]))
    touched = np.zeros(s.w.size, dtype=bool)
    touched[ids.ravel()] = True
    g += wd * s.w * (np.ones_like(s.w) if table else touched)
    if kind in ("adam", "lazy_adam"):
        if kind == "lazy_adam" and not (table and wd > 0):
            die("the lazy update of untouched rows is test_embed's; this test checks the dense one")
        eps = float(np.float32(sp.get("eps", 1e-8)))
        s.m += (1 - B1) * (g - s.m)  # torch's exp_avg.lerp_(grad, 1 - beta1)
        s.v = B2 * s.v + (1 - B2) * g * g
        step_size = lr / (1 - B1 ** t)
        s.w -= step_size * (s.m / (np.sqrt(s.v) / np.sqrt(1 - B2 ** t) + eps))
    elif kind == "sgd":
        s.w -= lr * g
    elif kind == "rowwise_adagrad":
        eps = float(np.float32(sp.get("eps", 1e-10)))
        s.accum += g * g  # a row of width 1: its mean square is g^2
        s.w -= lr * g / (np.sqrt(s.accum) + eps)
    s.bias -= DENSE_LR * d.sum()
    return touched


def close(what, got, want, atol, rtol):
    err = np.abs(got - want) - (atol + rtol * np.abs(want))
    if (err > 0).any():
        i = int(np.argmax(err))
        die(f"{what}: element {i}: dlrec {got[i]!r}, NumPy {want[i]!r} (and {int((err > 0).sum())} more beyond "
            f"{atol} + {rtol} |ref|)")


def check(args, name, sparse, data, table_rows):
    cfg = {"model": {"type": "lr"},
           "optimizer": {"dense": {"type": "sgd", "lr": DENSE_LR}, "sparse": sparse},
           "training": {"batch_size": BATCH, "epochs": 1, "threads": 2, "seed": 3, "deterministic": True,
                        "max_steps": STEPS},
           "loader": {"shuffle": False},
           "checkpoint": {"interval_steps": 1, "keep": STEPS + 1},
           "eval": {"train_rows": 0}}
    path = os.path.join(args.work, f"{name}.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    out = os.path.join(args.work, f"run-{name}")
    run(args.bin, "train", "-q", "--config", path, "--train", "train.dlr", "--etl", "etl", "--out", out)
    ckpt = lambda t: os.path.join(out, f"ckpt-{t:012d}")
    s = State(ckpt(1), table_rows)
    never = np.ones(table_rows, dtype=bool)
    for t in range(2, STEPS + 1):
        ids, labels = data[t - 1]
        never &= ~step(s, cfg, ids, labels, t)
        got = State(ckpt(t), table_rows)
        close(f"{name} step {t}: table", got.w, s.w, 1e-7, 2e-5)
        if s.m is not None:
            close(f"{name} step {t}: m", got.m, s.m, 1e-9, 2e-5)
            close(f"{name} step {t}: v", got.v, s.v, 1e-12, 2e-5)
            if (got.steps != t).any():
                die(f"{name} step {t}: rows with {sorted(set(got.steps.tolist()) - {t})} steps; Adam's every row "
                    f"has the global step")
        if s.accum is not None:
            close(f"{name} step {t}: accumulators", got.accum, s.accum, 1e-12, 2e-5)
        close(f"{name} step {t}: bias", np.array([got.bias]), np.array([s.bias]), 1e-6, 1e-5)
    # The test can tell the scopes apart: rows no step touched exist, and
    # under a table-wide L2 they moved (under "touched" with Adam, only
    # by the momentum of the steps that touched them).
    first = State(ckpt(1), table_rows)
    moved = never & (State(ckpt(STEPS), table_rows).w != first.w)
    if never.sum() < 10:
        die(f"{name}: test setup: only {never.sum()} rows untouched in steps 2..{STEPS}")
    table = sparse.get("l2_scope") == "table"
    if table and not moved[never].all():
        die(f"{name}: rows never touched kept still under a table-wide L2")
    with open(os.path.join(ckpt(STEPS), "config.json")) as f:
        written = json.load(f)["optimizer"]["sparse"]
    if ("l2_scope" in written) != table:
        die(f"{name}: config.json's optimizer.sparse {written}: l2_scope is written when not \"touched\" only")
    print(f"optim_ref: {name}: {STEPS - 1} steps match NumPy ({int(never.sum())} rows untouched, "
          f"{int(moved.sum())} of them moved)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--work", required=True)
    args = ap.parse_args()
    os.chdir(args.work)
    write_csv("clicks.csv", 400, 11)
    run(args.bin, "etl", "fit", "-q", "--format", "csv", "--schema", "label=click;cat=*", "--input", "clicks.csv",
        "--out", "etl")
    run(args.bin, "etl", "apply", "-q", "--etl", "etl", "--input", "clicks.csv", "--out", "train.dlr")
    data, table_rows = batches(args.bin, "train.dlr")
    wd = 0.01
    check(args, "adam-table", {"type": "adam", "lr": 0.01, "weight_decay": wd, "l2_scope": "table"}, data, table_rows)
    check(args, "adam-touched", {"type": "adam", "lr": 0.01, "weight_decay": wd}, data, table_rows)
    check(args, "adam-no-decay", {"type": "adam", "lr": 0.02}, data, table_rows)
    check(args, "lazy-adam-table", {"type": "lazy_adam", "lr": 0.01, "weight_decay": wd, "l2_scope": "table"}, data,
          table_rows)
    check(args, "sgd-table", {"type": "sgd", "lr": 0.5, "weight_decay": 0.05, "l2_scope": "table"}, data, table_rows)
    check(args, "adagrad-table", {"type": "rowwise_adagrad", "lr": 0.05, "weight_decay": 0.05, "l2_scope": "table"},
          data, table_rows)
    print("optim_ref: dlrec's table-wide updates match NumPy's PyTorch-style reference")


if __name__ == "__main__":
    main()
