#!/usr/bin/env python3
"""The data sets of bench/fuxictr_vs.sh: train, valid and test CSVs that dlrec and FuxiCTR both read.

usage:
  data.py ml100k --wheel recbole-1.2.1-py3-none-any.whl --out DIR [--seed S]
  data.py synth --tsv clicks.tsv --probs clicks.probs --out DIR [--seed S]

Both write DIR/train.csv, DIR/valid.csv, DIR/test.csv (a random 80/10/10 split of
the rows, numpy's RandomState(S) permutation: the first 80% train, the next 10%
valid, the rest test) and DIR/info.json (rows, click rates, the categorical
columns, and for synth the AUC of the true probabilities on the test rows). Every
column is categorical and written as a string; the label column is `label`.

ml100k: MovieLens-100K as RecBole 1.2.1's wheel ships it
(recbole/dataset_example/ml-100k/), one row per rating, label = rating >= 4.
Columns: user_id, item_id, the user's age, gender, occupation, zip_code, and
the item's release_year and genres. A movie's genres (RecBole's `class`, a space
separated list) are one token: the sorted set joined by '|' (e.g.
"Animation|Children's|Comedy"), so that both systems see one one-hot field and
no multi-hot pooling differs between them. The title and the timestamp are
dropped.

synth: `dlrec synth` rows (Criteo layout: label, I1..I13, C1..C26). The 13
numeric columns are dropped, so the set is all-categorical (C1..C26); the true
probabilities still depend on them, so no categorical model reaches their AUC.
"""
import argparse
import csv
import io
import json
import os
import sys
import zipfile

import numpy as np


def split_rows(n, seed):
    """The permutation's three parts: 80% train, 10% valid, the rest test."""
    perm = np.random.RandomState(seed).permutation(n)
    n_train, n_valid = int(n * 0.8), int(n * 0.1)
    return perm[:n_train], perm[n_train:n_train + n_valid], perm[n_train + n_valid:]


def write_csv(path, header, rows):
    with open(path + ".tmp", "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(header)
        w.writerows(rows)
    os.replace(path + ".tmp", path)


def auc(y, p):
    """The AUC by ranks (ties share their mean rank): an independent check, no sklearn needed."""
    y = np.asarray(y, dtype=np.float64)
    order = np.argsort(p, kind="mergesort")
    ps = np.asarray(p)[order]
    ranks = np.empty(len(p))
    i = 0
    while i < len(ps):
        j = i
        while j + 1 < len(ps) and ps[j + 1] == ps[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0 + 1
        i = j + 1
    pos = y.sum()
    neg = len(y) - pos
    return float((ranks[y == 1].sum() - pos * (pos + 1) / 2) / (pos * neg))


def read_atomic(zf, name):
    """A RecBole atomic file of the wheel: its header's field names (without ':type') and its rows."""
    text = zf.read("recbole/dataset_example/ml-100k/" + name).decode("utf-8")
    lines = text.rstrip("\n").split("\n")
    header = [h.split(":")[0] for h in lines[0].split("\t")]
    return header, [line.split("\t") for line in lines[1:]]


def ml100k(args):
    with zipfile.ZipFile(args.wheel) as zf:
        ih, inter = read_atomic(zf, "ml-100k.inter")
        uh, users = read_atomic(zf, "ml-100k.user")
        mh, items = read_atomic(zf, "ml-100k.item")
    user = {r[uh.index("user_id")]: r for r in users}
    item = {r[mh.index("item_id")]: r for r in items}
    cols = ["user_id", "item_id", "age", "gender", "occupation", "zip_code", "release_year", "genres"]
    rows = []
    for r in inter:
        u, i = r[ih.index("user_id")], r[ih.index("item_id")]
        ur, it = user[u], item[i]
        genres = "|".join(sorted(it[mh.index("class")].split())) if len(it) > mh.index("class") else ""
        year = it[mh.index("release_year")] if len(it) > mh.index("release_year") else ""
        label = 1 if float(r[ih.index("rating")]) >= 4 else 0
        rows.append([label, u, i, ur[uh.index("age")], ur[uh.index("gender")], ur[uh.index("occupation")],
                     ur[uh.index("zip_code")], year, genres])
    return cols, rows, None


def synth(args):
    cols = ["C%d" % k for k in range(1, 27)]
    rows = []
    with open(args.tsv) as f:
        for line in f:
            fields = line.rstrip("\n").split("\t")
            rows.append([int(fields[0])] + fields[14:40] + [""] * (40 - len(fields)))
    probs = np.loadtxt(args.probs, dtype=np.float64)
    if len(probs) != len(rows):
        sys.exit("data.py: %s has %d probabilities for %d rows" % (args.probs, len(probs), len(rows)))
    return cols, rows, probs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dataset", choices=["ml100k", "synth"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=2019)
    ap.add_argument("--wheel", help="ml100k: RecBole 1.2.1's wheel")
    ap.add_argument("--tsv", help="synth: dlrec synth's rows")
    ap.add_argument("--probs", help="synth: dlrec synth --probs's file")
    args = ap.parse_args()
    if args.dataset == "ml100k" and not args.wheel:
        ap.error("ml100k needs --wheel")
    if args.dataset == "synth" and not (args.tsv and args.probs):
        ap.error("synth needs --tsv and --probs")
    cols, rows, probs = (ml100k if args.dataset == "ml100k" else synth)(args)
    os.makedirs(args.out, exist_ok=True)
    parts = dict(zip(["train", "valid", "test"], split_rows(len(rows), args.seed)))
    info = {"dataset": args.dataset, "seed": args.seed, "label": "label", "categorical": cols, "rows": {},
            "ctr": {}}
    for name, idx in parts.items():
        write_csv(os.path.join(args.out, name + ".csv"), ["label"] + cols, (rows[i] for i in idx))
        info["rows"][name] = len(idx)
        info["ctr"][name] = round(float(np.mean([rows[i][0] for i in idx])), 6)
    if probs is not None:
        test = parts["test"]
        info["oracle_test_auc"] = round(auc([rows[i][0] for i in test], probs[test]), 6)
    with open(os.path.join(args.out, "info.json"), "w") as f:
        json.dump(info, f, indent=2)
    print(json.dumps(info))


if __name__ == "__main__":
    main()
