"""An independent NumPy re-implementation of dlrec's ETL encoding (Criteo
input), from the text of docs/etl.md alone, compared with what `dlrec etl
fit` writes (etl.json) and what `dlrec etl apply` encodes (read back with
`dlrec inspect --json --head N`).

It covers "Categorical ids" (vocabularies and *Hashing*), "Dense values",
"Column operators" (fill_missing, clip) and "Derived columns" (cross,
bucketize, count, target), with the fold hash of the target encoding.

usage:
  check.py inject IN OUT --tag T [--unseen]
      writes IN (a `dlrec synth` file) to OUT with a few edits that the
      synthetic data lacks: values seen once (out of vocabulary at
      --min-count 2), one value written three ways (`00c0ffee`, `c0ffee`,
      `C0FFEE`: one key), dense values written as floats, a negative I1,
      missing I2 values (synth's I2 is never missing, and I2 has a median
      fill).
      --unseen (an apply-only file): also values fit never saw, and I1
      values beyond every bucket fit saw.
  check.py flip IN OUT --line L
      OUT is IN with line L's label flipped.
  check.py verify --bin DLREC --workflow W.json --fit FILE... --etl DIR
                  --dlr OUT.dlr --apply FILE... [--target-encoding oof|full]
                  [--min-count K] [--hash-buckets N] [--dense-transform log|none]
                  [--standardize]
      fits the reference on the --fit files with the same options as the
      `etl fit` that wrote DIR, checks DIR/etl.json against it, encodes the
      --apply files and compares every row of OUT.dlr: labels and ids
      exactly, dense values within 1e-6 (relative or absolute).
  check.py leak --bin DLREC --workflow W.json --row R OOF.dlr OOF_FLIPPED.dlr
                FULL.dlr FULL_FLIPPED.dlr
      the target columns of row R (0-based), whose label was flipped between
      the two fits: bitwise unchanged out of fold, changed by the full
      encoding; and some other row's out-of-fold value changed.

Exits non-zero with a message naming the row, column, expected and got
value at the first mismatch.
"""
import argparse
import collections
import json
import math
import subprocess
import sys

import numpy as np

MASK64 = (1 << 64) - 1
# Raw keys: "an empty field's key is 2^64 - 1" (used by cross).
MISSING_KEY = MASK64
N_DENSE, N_CAT = 13, 26
DENSE_NAMES = [f"I{i}" for i in range(1, N_DENSE + 1)]
CAT_NAMES = [f"C{i}" for i in range(1, N_CAT + 1)]
FLOAT_TOL = 1e-6      # encoded dense values are float32
STAT_TOL = 1e-9       # etl.json statistics are doubles (summed in another order here)
TARGET_TAG = 0x74617267  # "targ", the fold hash's salt


class Mismatch(Exception):
    pass


def die(msg):
    sys.exit(f"check.py: FAIL: {msg}")


def mix64(x):
    """dlrec_mix64: splitmix64's finalizer, mod 2^64."""
    x &= MASK64
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & MASK64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & MASK64
    x ^= x >> 31
    return x


# ---------------------------------------------------------------- input

class Rows:
    """Criteo rows: label, I1..I13 (NaN where empty), C1..C26 keys (None
    where empty), and each row's input file index (0-based) and line
    number in that file (1-based)."""

    def __init__(self, paths):
        labels, dense, cats, files, lines = [], [], [], [], []
        for i, path in enumerate(paths):
            with open(path, "rb") as f:
                data = f.read()
            if data.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte-order mark is dropped
                data = data[3:]
            text = data.decode("ascii").split("\n")
            if text and text[-1] == "":  # no newline after the last line is fine too
                text.pop()
            for n, line in enumerate(text, 1):
                fields = line.rstrip("\r").split("\t")  # CRLF or LF
                if len(fields) > 1 + N_DENSE + N_CAT:
                    die(f"{path}:{n}: {len(fields)} fields")
                # trailing empty fields may be stripped: pad them back
                fields += [""] * (1 + N_DENSE + N_CAT - len(fields))
                labels.append(int(fields[0]))
                dense.append([float(v) if v else math.nan for v in fields[1:1 + N_DENSE]])
                # "A categorical key is the value of its hex digits"
                cats.append([int(v, 16) if v else None for v in fields[1 + N_DENSE:]])
                files.append(i)
                lines.append(n)
        self.n = len(labels)
        self.label = np.array(labels, dtype=np.int64)
        self.dense = np.array(dense, dtype=np.float64).reshape(self.n, N_DENSE)
        self.cat = cats
        self.file = files
        self.line = lines

    def dense_col(self, name):
        return self.dense[:, DENSE_NAMES.index(name)]

    def cat_col(self, name):
        c = CAT_NAMES.index(name)
        return [r[c] for r in self.cat]


# ---------------------------------------------------------------- categorical columns

class CatEncoder:
    """One categorical column's local ids, from per-row *classes*: the key
    (a vocabulary column) or the bucket (a hashed column); None = missing.

    Vocabulary ("Categorical ids"): 0 missing, 1 out of vocabulary (count
    below min_count, or unseen), kept values from 2 "by descending fit
    frequency; equal counts by ascending key"; size 2 + kept.
    Hashed ("Hashing"): local id 2 + rank(bucket), "buckets are ranked by
    descending fit frequency (ties: smaller bucket first)", every bucket
    ranked (seen or not); id 1 unused; size N + 2."""

    def __init__(self, name, fit_classes, min_count=1, buckets=None):
        self.name = name
        self.buckets = buckets
        self.counts = collections.Counter(c for c in fit_classes if c is not None)
        self.missing = sum(1 for c in fit_classes if c is None)
        if buckets is None:
            kept = sorted((k for k, n in self.counts.items() if n >= min_count),
                          key=lambda k: (-self.counts[k], k))
            self.local_of = {k: 2 + i for i, k in enumerate(kept)}
            self.size = 2 + len(kept)
            self.kept = len(kept)
            self.oov = sum(n for n in self.counts.values() if n < min_count)
        else:
            order = sorted(range(buckets), key=lambda b: (-self.counts.get(b, 0), b))
            self.local_of = {b: 2 + r for r, b in enumerate(order)}
            self.size = buckets + 2
        self.id_begin = None  # set when the schema is laid out

    @property
    def encoding(self):
        return "vocab" if self.buckets is None else "hashed"

    def local(self, cls):
        if cls is None:
            return 0
        return self.local_of.get(cls, 1)

    def fit_count(self, cls):
        """count encoding's x: "the fit count of the row's value (of its
        bucket, for a hashed column); 0 for a missing field and for a value
        out of vocabulary"."""
        if cls is None or cls not in self.local_of:
            return 0
        return self.counts.get(cls, 0)


class SourceColumn:
    """C1..C26: a vocabulary column, or hashed when --hash-buckets N is set
    and the column has more than N kept values (bucket mix64(k) % N;
    "Bucket counts include values below --min-count")."""

    def __init__(self, name, fit_keys, min_count, hash_buckets):
        self.name = name
        counts = collections.Counter(k for k in fit_keys if k is not None)
        self.distinct = len(counts)
        self.kept = sum(1 for n in counts.values() if n >= min_count)
        self.hash_buckets = hash_buckets if hash_buckets and self.kept > hash_buckets else None
        self.enc = CatEncoder(name, self.classes(fit_keys), min_count=min_count, buckets=self.hash_buckets)

    def classes(self, keys):
        if self.hash_buckets is None:
            return list(keys)
        return [None if k is None else mix64(k) % self.hash_buckets for k in keys]


class Cross:
    """cross: h = 0; h = mix64(h ^ k) for each source in order (k the key,
    2^64 - 1 for an empty field); bucket mix64(h) % buckets, a hashed column;
    a row whose sources are all missing has the missing id 0."""

    def __init__(self, spec, fit_rows):
        self.sources = list(spec["columns"])
        if not 2 <= len(self.sources) <= 8:
            die(f"cross of {len(self.sources)} columns in the workflow")
        self.buckets = int(spec["buckets"])
        # docs: the name "defaults to C1_x_C2"; for more sources this assumes
        # the same joiner (the workflow names its 3-column cross).
        self.name = spec.get("name", "_x_".join(self.sources))
        self.enc = CatEncoder(self.name, self.classes(fit_rows), buckets=self.buckets)

    def classes(self, rows):
        cols = [rows.cat_col(c) for c in self.sources]
        out = []
        for keys in zip(*cols):
            if all(k is None for k in keys):
                out.append(None)
                continue
            h = 0
            for k in keys:
                h = mix64(h ^ (MISSING_KEY if k is None else k))
            out.append(mix64(h) % self.buckets)
        return out


class Bucketize:
    """bucketize: x is the raw value after the source's clip, or its
    fill_missing value when missing (missing without a fill: id 0); bucket =
    searchsorted(boundaries, x, side="right"); boundaries given, or
    unique(quantile(v, [1/Q, ..., (Q-1)/Q])) of fit's present values after
    clipping (fills left out). A vocabulary of buckets: every bucket fit
    saw is kept (min_count does not apply), others out of vocabulary."""

    def __init__(self, spec, dense_by_name, fit_rows):
        self.source = spec["column"]
        self.name = spec.get("name", f"{self.source}_bucket")
        self.src = dense_by_name[self.source]
        self.quantiles = spec.get("quantiles")
        if self.quantiles is not None:
            q = int(self.quantiles)
            x = self.src.clipped(fit_rows.dense_col(self.source))
            v = x[~np.isnan(x)]
            self.boundaries = np.unique(np.quantile(v, np.arange(1, q) / q))
        else:
            self.boundaries = np.array(spec["boundaries"], dtype=np.float64)
        self.enc = CatEncoder(self.name, self.classes(fit_rows), min_count=1)

    def classes(self, rows):
        x = self.src.clipped(rows.dense_col(self.source))
        if self.src.fill is not None:
            # docs: "or its fill_missing value when missing" (taken as is; the
            # workflow keeps its fills inside their clip ranges, so whether the
            # fill is clipped too does not matter here)
            x = np.where(np.isnan(x), self.src.fill, x)
        b = np.searchsorted(self.boundaries, x, side="right")
        return [None if math.isnan(xi) else int(bi) for xi, bi in zip(x, b)]


# ---------------------------------------------------------------- dense columns

def transform(x, kind):
    """t = log(1 + max(x, 0)) (log, the default) or t = x (none), in double."""
    if kind == "log":
        return np.log1p(np.maximum(x, 0.0))
    return np.array(x, dtype=np.float64)


def mean_std(t):
    """mean and population std of t (a column with std 0 is divided by 1)."""
    mean = float(np.mean(t))
    std = float(np.sqrt(np.mean((t - mean) ** 2)))
    return mean, std


def standardize(t, mean, std):
    return (t - mean) / (std if std != 0 else 1.0)


class DenseColumn:
    """I1..I13 with the workflow's operators ("Dense values", "Column
    operators"): clip in raw units; fill_missing a number or "median" (of
    fit's values after clipping); a missing value without a fill encodes as
    0. Statistics: count/missing of present values; min/max of the clipped
    values; mean/std of t (after filling, the filled rows included)."""

    def __init__(self, name, ops, fit_rows, kind, std_on):
        self.name = name
        self.kind = kind
        self.std_on = std_on
        clip = ops.get("clip", [None, None])
        self.lo = -math.inf if clip[0] is None else float(clip[0])
        self.hi = math.inf if clip[1] is None else float(clip[1])
        x = self.clipped(fit_rows.dense_col(name))
        present = ~np.isnan(x)
        v = x[present]
        self.count = int(present.sum())
        self.missing = int((~present).sum())
        self.min = float(v.min()) if self.count else None
        self.max = float(v.max()) if self.count else None
        fill = ops.get("fill_missing")
        self.fill_kind = None if fill is None else ("median" if fill == "median" else "value")
        self.fill = None if fill is None else (float(np.median(v)) if fill == "median" else float(fill))
        t = transform(self.filled(x), kind)
        t = t[~np.isnan(t)]
        self.mean, self.std = mean_std(t)

    def clipped(self, x):
        return np.clip(x, self.lo, self.hi)  # NaN stays NaN

    def filled(self, x):
        if self.fill is None:
            return x
        return np.where(np.isnan(x), self.clipped(np.float64(self.fill)), x)

    def encode(self, rows):
        x = self.filled(self.clipped(rows.dense_col(self.name)))
        t = transform(x, self.kind)
        if self.std_on:
            t = standardize(t, self.mean, self.std)
        return np.where(np.isnan(x), 0.0, t)  # missing, no fill: 0 after everything


class CountEncoding:
    """count: x = fit count of the row's value or bucket (0 missing/OOV),
    then the dense transform and --standardize; statistics over fit's rows
    (count = rows, missing 0, min/max of x, mean/std of t)."""

    def __init__(self, spec, sources, fit_rows, kind, std_on):
        self.source = spec["column"]
        self.name = spec.get("name", f"{self.source}_count")
        self.src = sources[self.source]
        self.kind = kind
        self.std_on = std_on
        x = self.x(fit_rows)
        self.count, self.missing = fit_rows.n, 0
        self.min, self.max = float(x.min()), float(x.max())
        self.mean, self.std = mean_std(transform(x, kind))

    def x(self, rows):
        classes = self.src.classes(rows.cat_col(self.source))
        return np.array([self.src.enc.fit_count(c) for c in classes], dtype=np.float64)

    def encode(self, rows):
        t = transform(self.x(rows), self.kind)
        return standardize(t, self.mean, self.std) if self.std_on else t


def fold_of(seed, file_index, line, folds):
    """Row L (1-based) of input file i (0-based) is in fold
    mix64(mix64(mix64(seed ^ 0x74617267) ^ i) ^ L) % folds."""
    return mix64(mix64(mix64((seed & MASK64) ^ TARGET_TAG) ^ file_index) ^ line) % folds


class TargetEncoding:
    """target: groups are the source's local ids (values or buckets, the
    missing id 0, the OOV id 1). m = smoothing;
        full:        (P_g + m P/R) / (N_g + m)
        out of fold: (P_g - P_g,f + m p_f) / (N_g - N_g,f + m),
                     p_f = (P - P_f) / (R - R_f)  (0.5 when R_f = R).
    No dense transform; --standardize uses the mean and std of the full
    encoding over fit's rows."""

    def __init__(self, spec, sources, fit_rows, std_on):
        self.source = spec["column"]
        self.name = spec.get("name", f"{self.source}_target")
        self.src = sources[self.source]
        self.folds = int(spec.get("folds", 5))
        self.m = float(spec.get("smoothing", 20))
        self.seed = int(spec.get("seed", 0))
        self.std_on = std_on
        n = self.src.enc.size
        g = self.groups(fit_rows)
        f = self.row_folds(fit_rows)
        y = fit_rows.label
        self.Nf = np.zeros((self.folds, n), dtype=np.int64)  # rows of fold f in group g
        self.Pf = np.zeros((self.folds, n), dtype=np.int64)  # positives of fold f in group g
        np.add.at(self.Nf, (f, g), 1)
        np.add.at(self.Pf, (f, g), y)
        self.Ng, self.Pg = self.Nf.sum(0), self.Pf.sum(0)
        self.R, self.P = int(fit_rows.n), int(y.sum())
        self.Rf, self.Ppf = self.Nf.sum(1), self.Pf.sum(1)  # R_f, P_f
        self.full = (self.Pg + self.m * self.P / self.R) / (self.Ng + self.m)
        self.mean, self.std = mean_std(self.full[g])

    def groups(self, rows):
        classes = self.src.classes(rows.cat_col(self.source))
        return np.array([self.src.enc.local(c) for c in classes], dtype=np.int64)

    def row_folds(self, rows):
        return np.array([fold_of(self.seed, i, L, self.folds) for i, L in zip(rows.file, rows.line)],
                        dtype=np.int64)

    def encode(self, rows, mode):
        g = self.groups(rows)
        if mode == "full":
            v = self.full[g]
        else:
            f = self.row_folds(rows)
            rest_r = self.R - self.Rf
            rest_p = self.P - self.Ppf
            pf = np.where(rest_r == 0, 0.5, rest_p / np.maximum(rest_r, 1))
            v = (self.Pg[g] - self.Pf[f, g] + self.m * pf[f]) / (self.Ng[g] - self.Nf[f, g] + self.m)
        return standardize(v, self.mean, self.std) if self.std_on else v


# ---------------------------------------------------------------- the whole encoding

class Reference:
    """fit: the schema and every column's state, from the fit rows."""

    def __init__(self, fit_rows, workflow, min_count, hash_buckets, kind, std_on):
        self.fit_rows = fit_rows
        unknown = set(workflow) - {"dense", "cross", "bucketize", "count", "target"}
        if unknown:
            die(f"the workflow has keys this reference does not know: {sorted(unknown)}")
        dense_ops = workflow.get("dense", {})
        self.dense = [DenseColumn(n, dense_ops.get(n, {}), fit_rows, kind, std_on) for n in DENSE_NAMES]
        dense_by_name = {c.name: c for c in self.dense}
        self.sources = {n: SourceColumn(n, fit_rows.cat_col(n), min_count, hash_buckets) for n in CAT_NAMES}
        self.counts = [CountEncoding(s, self.sources, fit_rows, kind, std_on) for s in workflow.get("count", [])]
        self.targets = [TargetEncoding(s, self.sources, fit_rows, std_on) for s in workflow.get("target", [])]
        self.crosses = [Cross(s, fit_rows) for s in workflow.get("cross", [])]
        self.buckets = [Bucketize(s, dense_by_name, fit_rows) for s in workflow.get("bucketize", [])]
        # Schema order: dense = input's, count, target; categorical = input's,
        # cross, bucketize; id_begin = the sum of the sizes before.
        self.dense_cols = self.dense + self.counts + self.targets
        self.cat_cols = [self.sources[n] for n in CAT_NAMES] + self.crosses + self.buckets
        begin = 0
        for c in self.cat_cols:
            c.enc.id_begin = begin
            begin += c.enc.size
        self.table_rows = begin
        names = [c.name for c in self.dense_cols] + [c.name for c in self.cat_cols]
        if len(set(names)) != len(names):
            die(f"column names repeat: {names}")

    def encode(self, rows, mode):
        """(labels, dense float32 values as float64 (rows, D), global ids (rows, C))."""
        dense = []
        for c in self.dense_cols:
            v = c.encode(rows, mode) if isinstance(c, TargetEncoding) else c.encode(rows)
            dense.append(np.asarray(v, dtype=np.float64).astype(np.float32).astype(np.float64))
        ids = []
        for c in self.cat_cols:
            ids.append(np.array([c.enc.id_begin + c.enc.local(k) for k in c.classes(
                rows.cat_col(c.name) if isinstance(c, SourceColumn) else rows)], dtype=np.int64))
        return rows.label, np.stack(dense, axis=1), np.stack(ids, axis=1)


# ---------------------------------------------------------------- comparisons

def close(a, b, tol):
    return abs(a - b) <= tol * max(1.0, abs(a))


def expect(cond, msg):
    if not cond:
        raise Mismatch(msg)


def expect_close(what, want, got, tol=STAT_TOL):
    expect(got is not None and close(float(want), float(got), tol), f"{what}: expected {want!r}, got {got!r}")


def check_state(ref, state, args):
    """etl.json against the reference: the options, the schema and the
    documented statistics."""
    expect(state.get("min_count") == args.min_count, f"etl.json min_count {state.get('min_count')}")
    expect(state.get("hash_buckets") == args.hash_buckets, f"etl.json hash_buckets {state.get('hash_buckets')}")
    want_kind = "log1p" if args.dense_transform == "log" else "none"
    expect(state.get("dense_transform") == want_kind, f"etl.json dense_transform {state.get('dense_transform')}")
    expect(state.get("standardize") == args.standardize, f"etl.json standardize {state.get('standardize')}")
    expect(state.get("rows") == ref.fit_rows.n, f"etl.json rows: expected {ref.fit_rows.n}, got {state.get('rows')}")
    positives = int(ref.fit_rows.label.sum())
    expect(state.get("positives") == positives, f"etl.json positives: expected {positives}, got {state.get('positives')}")
    expect(state.get("table_rows") == ref.table_rows,
           f"etl.json table_rows: expected {ref.table_rows}, got {state.get('table_rows')}")

    dense = state["dense"]
    expect([d["name"] for d in dense] == [c.name for c in ref.dense_cols],
           f"etl.json dense columns: expected {[c.name for c in ref.dense_cols]}, got {[d['name'] for d in dense]}")
    for c, d in zip(ref.dense_cols, dense):
        w = f"etl.json dense {c.name}"
        if isinstance(c, TargetEncoding):
            op = d.get("op", {})
            expect(op.get("kind") == "target" and op.get("column") == c.source and op.get("folds") == c.folds
                   and float(op.get("smoothing", -1)) == c.m and op.get("seed") == c.seed, f"{w}: op {op}")
            expect_close(f"{w} mean (of the full encoding)", c.mean, d.get("mean"))
            expect_close(f"{w} std (of the full encoding)", c.std, d.get("std"))
            continue
        if isinstance(c, CountEncoding):
            op = d.get("op", {})
            expect(op.get("kind") == "count" and op.get("column") == c.source, f"{w}: op {op}")
        else:
            expect("op" not in d, f"{w}: an input column with an op")
            if c.fill is not None:
                fm = d.get("fill_missing", {})
                # docs: {"kind": "median", "value": 3}; a number's kind is not
                # documented (this binary says "constant")
                expect((fm.get("kind") == "median") == (c.fill_kind == "median"), f"{w}: fill_missing {fm}")
                expect_close(f"{w} fill_missing value", c.fill, fm.get("value"))
        expect(d["count"] == c.count, f"{w} count: expected {c.count}, got {d['count']}")
        expect(d["missing"] == c.missing, f"{w} missing: expected {c.missing}, got {d['missing']}")
        if c.count:
            expect_close(f"{w} min", c.min, d.get("min"))
            expect_close(f"{w} max", c.max, d.get("max"))
        expect_close(f"{w} mean", c.mean, d.get("mean"))
        expect_close(f"{w} std", c.std, d.get("std"))

    cats = state["categorical"]
    expect([d["name"] for d in cats] == [c.name for c in ref.cat_cols],
           f"etl.json categorical columns: expected {[c.name for c in ref.cat_cols]}, got {[d['name'] for d in cats]}")
    for c, d in zip(ref.cat_cols, cats):
        w = f"etl.json categorical {c.name}"
        e = c.enc
        for key, want in (("encoding", e.encoding), ("size", e.size), ("id_begin", e.id_begin),
                          ("id_end", e.id_begin + e.size), ("missing", e.missing)):
            expect(d.get(key) == want, f"{w} {key}: expected {want}, got {d.get(key)}")
        if e.buckets is not None:
            expect(d.get("buckets") == e.buckets, f"{w} buckets: expected {e.buckets}, got {d.get('buckets')}")
        if isinstance(c, SourceColumn):
            expect("op" not in d, f"{w}: an input column with an op")
            expect(d.get("distinct") == c.distinct, f"{w} distinct: expected {c.distinct}, got {d.get('distinct')}")
            expect(d.get("kept") == c.kept, f"{w} kept: expected {c.kept}, got {d.get('kept')}")
            if e.buckets is None:
                expect(d.get("oov") == e.oov, f"{w} oov: expected {e.oov}, got {d.get('oov')}")
        elif isinstance(c, Cross):
            op = d.get("op", {})
            expect(op.get("kind") == "cross" and op.get("columns") == c.sources, f"{w}: op {op}")
        else:
            op = d.get("op", {})
            expect(op.get("kind") == "bucketize" and op.get("column") == c.source, f"{w}: op {op}")
            got = op.get("boundaries")
            expect(isinstance(got, list) and len(got) == len(c.boundaries)
                   and all(close(a, b, 1e-12) for a, b in zip(c.boundaries, got)),
                   f"{w} boundaries: expected {c.boundaries.tolist()}, got {got}")
            if c.quantiles is not None:
                expect(op.get("quantiles") == c.quantiles, f"{w}: op.quantiles {op.get('quantiles')}")


def inspect(bin_, path):
    """`dlrec inspect --json` with every row (its head)."""
    info = json.loads(subprocess.run([bin_, "inspect", path, "--json", "-q"], check=True,
                                     capture_output=True, text=True).stdout)
    n = info["rows"]
    info = json.loads(subprocess.run([bin_, "inspect", path, "--json", "-q", "--head", str(max(n, 1))],
                                     check=True, capture_output=True, text=True).stdout)
    if not info.get("ok", False):
        die(f"{path}: inspect does not verify it: {info.get('errors')}")
    return info


def check_rows(ref, rows, info, mode, path):
    """Every encoded row of the .dlr file against the reference."""
    want_dense = [c.name for c in ref.dense_cols]
    expect(info["dense"] == want_dense, f"{path}: dense columns: expected {want_dense}, got {info['dense']}")
    sparse = info["sparse"]
    expect([s["name"] for s in sparse] == [c.name for c in ref.cat_cols],
           f"{path}: sparse columns: expected {[c.name for c in ref.cat_cols]}, got {[s['name'] for s in sparse]}")
    for c, s in zip(ref.cat_cols, sparse):
        want = (c.enc.id_begin, c.enc.id_begin + c.enc.size, 1, 1)
        got = (s["id_begin"], s["id_end"], s["hotness"], s["max_hotness"])
        expect(got == want, f"{path}: column {c.name}: (id_begin, id_end, hotness, max_hotness) expected {want}, got {got}")
    expect(info["table_rows"] == ref.table_rows, f"{path}: table_rows: expected {ref.table_rows}, got {info['table_rows']}")
    expect(info["rows"] == rows.n, f"{path}: {info['rows']} rows, expected {rows.n}")
    head = info["head"]
    label, dense, ids = ref.encode(rows, mode)
    for r, row in enumerate(head):
        where = f"{path}: row {r} (file {rows.file[r]} line {rows.line[r]})"
        expect(row["label"] == int(label[r]), f"{where}: label expected {int(label[r])}, got {row['label']}")
        got_d = row["dense"]
        for j, name in enumerate(want_dense):
            expect(close(dense[r, j], got_d[j], FLOAT_TOL),
                   f"{where}, dense column {name}: expected {float(dense[r, j])!r}, got {got_d[j]!r}")
        got_s = row["sparse"]
        for j, c in enumerate(ref.cat_cols):
            g = got_s[c.name]
            want = int(ids[r, j])
            expect(g == [want],
                   f"{where}, column {c.name}: expected id {want} (local {want - c.enc.id_begin}), "
                   f"got {g} (local {[x - c.enc.id_begin for x in g]})")
    return dense, ids


def fmt_cols(cols):
    return ", ".join(f"{c.name} ({c.enc.encoding} {c.enc.size})" for c in cols)


def cmd_verify(args):
    with open(args.workflow) as f:
        workflow = json.load(f)
    fit_rows = Rows(args.fit)
    ref = Reference(fit_rows, workflow, args.min_count, args.hash_buckets, args.dense_transform, args.standardize)
    with open(f"{args.etl}/etl.json") as f:
        state = json.load(f)
    apply_rows = Rows(args.apply)
    label = args.label or args.dlr
    try:
        check_state(ref, state, args)
        info = inspect(args.bin, args.dlr)
        check_rows(ref, apply_rows, info, args.target_encoding, args.dlr)
    except Mismatch as e:
        die(f"[{label}] {e}")
    hashed = [c.name for c in ref.sources.values() if c.hash_buckets is not None]
    oov = sum(1 for c in ref.cat_cols for k in c.classes(apply_rows.cat_col(c.name) if isinstance(c, SourceColumn)
                                                          else apply_rows) if c.enc.local(k) == 1)
    print(f"ok [{label}] {apply_rows.n} rows x ({len(ref.dense_cols)} dense, {len(ref.cat_cols)} categorical), "
          f"target encoding {args.target_encoding}; {oov} OOV ids; "
          f"hashed inputs: {', '.join(hashed) or 'none'}; "
          f"derived dense: {', '.join(c.name for c in ref.counts + ref.targets) or 'none'}; "
          f"derived categorical: {fmt_cols(ref.crosses + ref.buckets) or 'none'}")


def cmd_leak(args):
    with open(args.workflow) as f:
        workflow = json.load(f)
    names = [s.get("name", f"{s['column']}_target") for s in workflow.get("target", [])]
    if not names:
        die("the workflow has no target column")
    infos = [inspect(args.bin, p) for p in (args.oof, args.oof_flipped, args.full, args.full_flipped)]
    cols = [infos[0]["dense"].index(n) for n in names]

    def values(info):
        return np.array([[row["dense"][j] for j in cols] for row in info["head"]], dtype=np.float64)

    oof, oof_f, full, full_f = (values(i) for i in infos)
    r = args.row
    for k, name in enumerate(names):
        if oof[r, k] != oof_f[r, k]:
            die(f"[leak] row {r}, column {name}: its out-of-fold value changed when its own label flipped: "
                f"expected {oof[r, k]!r}, got {oof_f[r, k]!r}")
        if full[r, k] == full_f[r, k]:
            die(f"[leak] row {r}, column {name}: the full encoding did not change when the row's label flipped "
                f"({full[r, k]!r})")
    changed = np.any(oof != oof_f, axis=1)
    changed[r] = False
    if not changed.any():
        die("[leak] no other row's out-of-fold target encoding changed when row "
            f"{r}'s label flipped: the check could not fail")
    print(f"ok [leak] row {r}'s label flipped: its out-of-fold {', '.join(names)} unchanged bitwise, "
          f"{int(changed.sum())} other rows changed; its full encoding changed")


def cmd_inject(args):
    """Edits of a synth file (see the module's docstring). The tag keeps
    the once-seen keys of the two fit files apart."""
    with open(args.input) as f:
        lines = f.read().split("\n")
    if lines[-1] == "":
        lines.pop()
    c = {n: 1 + N_DENSE + i for i, n in enumerate(CAT_NAMES)}
    d = {n: 1 + i for i, n in enumerate(DENSE_NAMES)}
    serial = 0
    for n in range(1, len(lines) + 1):
        fields = lines[n - 1].split("\t")
        fields += [""] * (1 + N_DENSE + N_CAT - len(fields))
        if n % 41 == 5:  # values seen once: out of vocabulary at --min-count 2
            for col in ("C1", "C3", "C9", "C19"):
                fields[c[col]] = f"{0xf00d0000 + args.tag * 0x1000 + serial:08x}"
                serial += 1
        if args.tag == 0 and n in (7, 8, 9):  # one key three ways: seen 3 times
            fields[c["C3"]] = {7: "00c0ffee", 8: "c0ffee", 9: "C0FFEE"}[n]
            fields[c["C9"]] = {7: "0BEEF", 8: "beef", 9: ""}[n]  # twice: kept at --min-count 2
        if n == 3:
            fields[d["I4"]] = "12.0"
        if n == 4:
            fields[d["I6"]] = "1e3"
        if n == 6:
            fields[d["I1"]] = "-2"
        if n % 53 == 11:  # I2 is never missing in synth's rows: its median fill is used
            fields[d["I2"]] = ""
        if args.unseen and n % 7 == 0:  # a key fit never saw, an I1 beyond the buckets fit saw
            fields[c["C3"]] = f"{0xdead0000 + n:08x}"
            fields[c["C9"]] = f"{0xdead0000 + n:08x}"
            fields[c["C19"]] = f"{0xdead0000 + n:08x}"
            fields[d["I1"]] = "5000"
        lines[n - 1] = "\t".join(fields)
    with open(args.output, "w") as f:
        f.write("\n".join(lines) + "\n")


def cmd_flip(args):
    with open(args.input) as f:
        lines = f.read().split("\n")
    fields = lines[args.line - 1].split("\t")
    fields[0] = {"0": "1", "1": "0"}[fields[0]]
    lines[args.line - 1] = "\t".join(fields)
    with open(args.output, "w") as f:
        f.write("\n".join(lines))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("verify")
    v.add_argument("--bin", required=True)
    v.add_argument("--workflow", required=True)
    v.add_argument("--fit", nargs="+", required=True)
    v.add_argument("--etl", required=True)
    v.add_argument("--dlr", required=True)
    v.add_argument("--apply", nargs="+", required=True)
    v.add_argument("--target-encoding", choices=["oof", "full"], default="oof")
    v.add_argument("--min-count", type=int, default=1)
    v.add_argument("--hash-buckets", type=int, default=0)
    v.add_argument("--dense-transform", choices=["log", "none"], default="log")
    v.add_argument("--standardize", action="store_true")
    v.add_argument("--label", help="the check's name in messages")
    lk = sub.add_parser("leak")
    lk.add_argument("--bin", required=True)
    lk.add_argument("--workflow", required=True)
    lk.add_argument("--row", type=int, required=True)
    lk.add_argument("oof")
    lk.add_argument("oof_flipped")
    lk.add_argument("full")
    lk.add_argument("full_flipped")
    i = sub.add_parser("inject")
    i.add_argument("input")
    i.add_argument("output")
    i.add_argument("--tag", type=int, required=True)
    i.add_argument("--unseen", action="store_true")
    fl = sub.add_parser("flip")
    fl.add_argument("input")
    fl.add_argument("output")
    fl.add_argument("--line", type=int, required=True)
    args = p.parse_args()
    {"verify": cmd_verify, "leak": cmd_leak, "inject": cmd_inject, "flip": cmd_flip}[args.cmd](args)


if __name__ == "__main__":
    main()
