"""Scores a .dlr file's first rows with an exported ONNX model under
onnxruntime and compares with `dlrec predict`'s probabilities.

usage: check.py DLREC_BIN MODEL.onnx DATA.dlr SCORES.txt ROWS

The inputs are built from `dlrec inspect --head ROWS --json` (each row's
dense values and each categorical column's ids), as docs/export.md lays
them out: dense (N, n_dense) float32, ids (N, S) int64 with max_hotness
slots per column, unused slots -1. Fails (exit 1) when any probability
differs from predict's by more than 1e-5."""
import json
import subprocess
import sys

import numpy as np
import onnxruntime as ort

TOL = 1e-5


def main():
    bin_, model, data, scores, rows = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
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


if __name__ == "__main__":
    main()
