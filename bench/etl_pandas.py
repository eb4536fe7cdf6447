#!/usr/bin/python3
"""The pandas side of bench/etl_vs_pandas.sh: the same work as `dlrec etl fit`
followed by `dlrec etl apply` on a Criteo TSV file, done the usual pandas way.

  read_csv (C engine) with the Criteo column names and dtypes (float32 label
  and dense, str for C1..C26: faster than dtype "category" here); per
  categorical column, pd.factorize and ids ordered by frequency (ties: value
  order), 0 for missing, 1 reserved for OOV, 2.. for values, as dlrec numbers
  them; log1p of the dense values clipped at 0, missing -> 0;
  labels as float32; one binary numpy file of the encoded columns.

usage: etl_pandas.py DATA.tsv|DATA.parquet OUT.npz [--fill-clip HIGH]
With --fill-clip, each dense column is first filled with its median where
missing and clipped to [0, HIGH] (as `dlrec etl fit --workflow` with
"fill_missing": "median", "clip": [0, HIGH] on every dense column), the
median taken after clipping as dlrec takes it.
A .parquet file (the columns by name, as bench/python_vs_cli.sh writes it)
is read with pd.read_parquet instead of read_csv.
Prints the seconds taken (reading included, interpreter start excluded).
"""
import sys
import time

import numpy as np
import pandas as pd


def main():
    path, out = sys.argv[1], sys.argv[2]
    clip_high = float(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[3] == "--fill-clip" else None
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
    np.savez(out, labels=labels, dense=x, ids=ids)
    print(f"{time.perf_counter() - t0:.3f}")


if __name__ == "__main__":
    main()
