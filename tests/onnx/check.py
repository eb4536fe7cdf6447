"""Scores a .dlr file's first rows with an exported ONNX model under
onnxruntime and compares with `dlrec predict`'s probabilities.

usage: check.py DLREC_BIN MODEL.onnx DATA.dlr SCORES.txt ROWS [--out-of-table]

The inputs are built from `dlrec inspect --head ROWS --json` (each row's
dense values and each categorical column's ids), as docs/export.md lays
them out: dense (N, n_dense) float32, ids (N, S) int64 with max_hotness
slots per column, unused slots -1. Fails (exit 1) when any probability
differs from predict's by more than 1e-5.

A batch of 0 rows must give outputs of 0 rows. With --out-of-table, ids
outside the table (-1, -5, table_rows, table_rows + 7) in each column's
first slot must score exactly as the zero row: as the same rows scored by
a copy of the model whose table row r (an id none of them holds) is
zeroed, with r in a one-hot column's slot and -1 (padding) in a multi-hot
column's."""
import json
import subprocess
import sys

import numpy as np
import onnxruntime as ort

TOL = 1e-5
BAD = (-1, -5, 0, 7)  # 0 and 7 stand for table_rows and table_rows + 7


def varint(b, i):
    v = shift = 0
    while True:
        v |= (b[i] & 0x7F) << shift
        i += 1
        shift += 7
        if b[i - 1] < 0x80:
            return v, i


def fields(b, i, end):
    """The fields of the protobuf message b[i:end]: (number, value), a
    varint's value or a length-delimited field's (start, end)."""
    while i < end:
        key, i = varint(b, i)
        wire = key & 7
        if wire == 0:
            v, i = varint(b, i)
        elif wire == 2:
            n, i = varint(b, i)
            v, i = (i, i + n), i + n
        elif wire in (1, 5):
            v, i = None, i + (8 if wire == 1 else 4)
        else:
            sys.exit(f"check.py: protobuf wire type {wire} in the model")
        yield key >> 3, v


def zero_row(model, r):
    """The model's bytes with row r of its embedding table (the initializer
    named table_*: ModelProto.graph 7, GraphProto.initializer 5,
    TensorProto dims 1, name 8, raw_data 9) set to zeros."""
    b = bytearray(open(model, "rb").read())
    graph = next(v for f, v in fields(b, 0, len(b)) if f == 7)
    for f, (lo, hi) in fields(b, *graph):
        if f != 5:
            continue
        t = list(fields(b, lo, hi))
        name = next(bytes(b[v[0]:v[1]]) for k, v in t if k == 8)
        if name.startswith(b"table_"):
            dims = [v for k, v in t if k == 1]
            raw = next(v for k, v in t if k == 9)[0]
            b[raw + 4 * r * dims[1]:raw + 4 * (r + 1) * dims[1]] = bytes(4 * dims[1])
            return bytes(b)
    sys.exit(f"check.py: {model} has no table_* initializer")


def check_out_of_table(sess, model, feeds, slots, table_rows):
    """Ids outside [0, table_rows) score as the zero row (exactly)."""
    k = min(8, len(feeds["ids"]))
    ids = feeds["ids"][:k]
    used = set(ids.ravel().tolist())
    r = max(i for i in range(table_rows) if i not in used)
    first = np.cumsum([0] + slots[:-1])
    ref = ids.copy()
    for c, s0 in enumerate(first):
        ref[:, s0] = r if slots[c] == 1 else -1
    base = {name: v[:k] for name, v in feeds.items()}
    base["ids"] = ref
    want = ort.InferenceSession(zero_row(model, r), providers=["CPUExecutionProvider"]).run(["logit"], base)[0]
    for j in range(len(BAD)):
        bad = ref.copy()
        for c, s0 in enumerate(first):  # each column a different bad id, each id in each column once
            v = BAD[(c + j) % len(BAD)]
            bad[:, s0] = v + table_rows if v >= 0 else v
        got = sess.run(["logit"], dict(base, ids=bad))[0]
        if not np.array_equal(got, want):
            sys.exit(f"check.py: {model}: ids outside the table {bad[0, first].tolist()} score {got[:, 0]!r}, "
                     f"the zero row {want[:, 0]!r}")


def main():
    bin_, model, data, scores, rows = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
    if sys.argv[6:] not in ([], ["--out-of-table"]):
        sys.exit(f"check.py: unknown arguments {sys.argv[6:]}")
    out_of_table = sys.argv[6:] == ["--out-of-table"]
    info = json.loads(subprocess.run([bin_, "inspect", data, "--head", str(rows), "--json"], check=True,
                                     capture_output=True, text=True).stdout)
    head = info["head"]
    sparse = info["sparse"]  # per column: name, hotness, max_hotness, ...
    slots = [max(1, c["max_hotness"]) for c in sparse]
    n = len(head)
    feeds = {}
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}
    if "dense" in names:
        feeds["dense"] = np.array([r["dense"] for r in head], dtype=np.float32)
    if "ids" in names:
        ids = np.full((n, sum(slots)), -1, dtype=np.int64)
        for b, r in enumerate(head):
            s0 = 0
            for c, h in zip(sparse, slots):
                v = r["sparse"][c["name"]]
                ids[b, s0:s0 + len(v)] = v
                s0 += h
        feeds["ids"] = ids
    if names != set(feeds):
        sys.exit(f"check.py: the graph's inputs {sorted(names)} are not the data's {sorted(feeds)}")
    prob = sess.run(["prob"], feeds)[0].reshape(-1)
    want = np.loadtxt(scores, dtype=np.float64).reshape(-1)[:n]
    diff = np.abs(prob.astype(np.float64) - want)
    worst = int(diff.argmax())
    print(f"{model}: {n} rows, max |p_onnx - p_predict| = {diff[worst]:.2e} (row {worst})")
    if not diff[worst] <= TOL:
        sys.exit(f"check.py: row {worst}: onnxruntime {prob[worst]!r}, dlrec predict {want[worst]!r}")
    shapes = [o.shape for o in sess.run(["prob", "logit"], {name: v[:0] for name, v in feeds.items()})]
    if shapes != [(0, 1), (0, 1)]:
        sys.exit(f"check.py: {model}: a batch of 0 rows gives outputs of shapes {shapes}")
    if out_of_table and "ids" in feeds:
        check_out_of_table(sess, model, feeds, slots, info["table_rows"])
        print(f"{model}: ids outside the table score as the zero row")


if __name__ == "__main__":
    main()
