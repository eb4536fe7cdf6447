#!/usr/bin/python3
"""The pandas side of bench/etl_vs_pandas.sh: the same work as `dlrec etl fit`
followed by `dlrec etl apply` on a Criteo TSV file, done the usual pandas way.

  read_csv (C engine) with the Criteo column names and dtypes (float32 label
  and dense, str for C1..C26: faster than dtype "category" here); per
  categorical column, pd.factorize and ids ordered by frequency (ties: value
  order), 0 for missing, 1 reserved for OOV, 2.. for values, as dlrec numbers
  them; log1p of the dense values clipped at 0, missing -> 0;
  labels as float32; one binary numpy file of the encoded columns.

usage: etl_pandas.py DATA.tsv|DATA.parquet OUT.npz [--fill-clip HIGH] [--derived]
With --fill-clip, each dense column is first filled with its median where
missing and clipped to [0, HIGH] (as `dlrec etl fit --workflow` with
"fill_missing": "median", "clip": [0, HIGH] on every dense column), the
median taken after clipping as dlrec takes it.
With --derived, the derived columns of bench/etl_ops_vs_pandas.sh's
workflow too (DERIVED below: the same operators on the same columns, the
usual pandas way; hashes are pandas' own, not dlrec's): hashed crosses,
bucketized columns (given and quantile boundaries), count encodings and
5-fold out-of-fold target encodings.
A .parquet file (the columns by name, as bench/python_vs_cli.sh writes it)
is read with pd.read_parquet instead of read_csv.
Prints the seconds taken (reading included, interpreter start excluded).
"""
import sys
import time

import numpy as np
import pandas as pd


# The derived columns of bench/etl_ops_vs_pandas.sh's workflow.
CROSSES = [(["C1", "C2"], 100000), (["C3", "C4", "C5"], 100000)]
BUCKETIZE = [("I1", None, 10), ("I2", [1, 10, 100, 1000], None)]
COUNT = ["C3", "C4"]
TARGET = ["C5", "C6"]
FOLDS, SMOOTHING = 5, 20.0


def rank_ids(codes, n):
    """Ids by descending frequency (ties: smaller code first), 2.., 0 for -1."""
    counts = np.bincount(codes[codes >= 0], minlength=n)
    order = np.argsort(-counts, kind="stable")
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    return np.where(codes >= 0, rank[np.maximum(codes, 0)] + 2, 0)


def derived(df, dense):
    """The derived columns: (dense features, categorical ids) as numpy arrays."""
    cat_out, dense_out = [], []
    for cols, buckets in CROSSES:
        h = pd.util.hash_pandas_object(df[cols], index=False).to_numpy() % np.uint64(buckets)
        cat_out.append(rank_ids(h.astype(np.int64), buckets))
    for col, bounds, q in BUCKETIZE:
        v = df[col].to_numpy(np.float64)
        if q:
            bounds = np.unique(np.nanquantile(v, np.arange(1, q) / q))
        b = np.searchsorted(bounds, v, side="right")
        cat_out.append(rank_ids(np.where(np.isnan(v), -1, b), len(bounds) + 1))
    for col in COUNT:
        x = df[col].map(df[col].value_counts()).fillna(0).to_numpy(np.float64)
        dense_out.append(np.log1p(x))
    y = df["label"].to_numpy(np.float64)
    fold = pd.util.hash_pandas_object(pd.Series(np.arange(len(df))), index=False).to_numpy() % np.uint64(FOLDS)
    fold = fold.astype(np.int64)
    total_r, total_p = len(df), y.sum()
    fr = np.bincount(fold, minlength=FOLDS).astype(np.float64)
    fp = np.bincount(fold, weights=y, minlength=FOLDS)
    for col in TARGET:
        codes, uniques = pd.factorize(df[col])  # -1: missing, its own group
        g = codes + 1
        n_g = np.bincount(g, minlength=len(uniques) + 1).astype(np.float64)
        p_g = np.bincount(g, weights=y, minlength=len(uniques) + 1)
        key = g * FOLDS + fold
        n_gf = np.bincount(key, minlength=(len(uniques) + 1) * FOLDS).astype(np.float64)
        p_gf = np.bincount(key, weights=y, minlength=(len(uniques) + 1) * FOLDS)
        prior_f = (total_p - fp) / (total_r - fr)
        enc = (p_g[g] - p_gf[key] + SMOOTHING * prior_f[fold]) / (n_g[g] - n_gf[key] + SMOOTHING)
        dense_out.append(enc)
    return np.stack(dense_out, axis=1).astype(np.float32), np.stack(cat_out, axis=1).astype(np.uint32)


def main():
    path, out = sys.argv[1], sys.argv[2]
    clip_high = float(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[3] == "--fill-clip" else None
    with_derived = "--derived" in sys.argv[3:]
    dense = [f"I{i}" for i in range(1, 14)]
    cats = [f"C{i}" for i in range(1, 27)]
    names = ["label"] + dense + cats
    dtypes = {"label": np.float32, **{c: np.float32 for c in dense}, **{c: str for c in cats}}
    t0 = time.perf_counter()
    if path.endswith(".parquet"):
        df = pd.read_parquet(path, columns=names)
    else:
        df = pd.read_csv(path, sep="\t", header=None, names=names, dtype=dtypes, engine="c")
    labels = df["label"].to_numpy(np.float32)
    if clip_high is not None:
        for c in dense:
            col = df[c].clip(0, clip_high)
            df[c] = col.fillna(col.median())
    extra = derived(df, dense) if with_derived else None
    x = df[dense].to_numpy(np.float32)
    x = np.log1p(np.clip(x, 0, None))
    x = np.nan_to_num(x, nan=0.0).astype(np.float32)
    ids = np.empty((len(df), len(cats)), dtype=np.uint32)
    begin = 0
    for j, c in enumerate(cats):
        codes, uniques = pd.factorize(df[c], sort=True)  # -1 for missing; uniques in value order
        n_cat = len(uniques)
        counts = np.bincount(codes[codes >= 0], minlength=n_cat)
        order = np.argsort(-counts, kind="stable")  # frequency, ties by value
        rank = np.empty(n_cat, dtype=np.int64)
        rank[order] = np.arange(n_cat)
        local = np.where(codes >= 0, rank[np.maximum(codes, 0)] + 2, 0)
        ids[:, j] = begin + local
        begin += n_cat + 2
    if extra is not None:
        x = np.concatenate([x, extra[0]], axis=1)
        ids = np.concatenate([ids, extra[1]], axis=1)
    np.savez(out, labels=labels, dense=x, ids=ids)
    print(f"{time.perf_counter() - t0:.3f}")


if __name__ == "__main__":
    main()
