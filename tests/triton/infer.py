"""The official Triton HTTP client (tritonclient.http) against `dlrec serve`.

usage: infer.py PORT ROWS.tsv SCORES.txt

Checks server and model readiness and metadata through the client, then
scores the label-less raw rows of ROWS.tsv (13 dense + 26 categorical
fields) in one request with JSON tensors and in one with binary tensors,
and requires OUTPUT0 to equal SCORES.txt (`dlrec predict` on the same rows)
bit for bit. Exits non-zero with a message on any difference.
"""
import sys

import numpy as np
import tritonclient.http as httpclient


def main():
    port, rows_path, scores_path = sys.argv[1], sys.argv[2], sys.argv[3]
    rows = [line.rstrip("\n").split("\t") for line in open(rows_path)]
    want = np.array([float(x) for x in open(scores_path)], dtype=np.float32)
    dense = np.array([r[:13] for r in rows], dtype=np.object_)
    cat = np.array([r[13:] for r in rows], dtype=np.object_)
    c = httpclient.InferenceServerClient(url=f"127.0.0.1:{port}")
    assert c.is_server_live(), "server not live"
    assert c.is_server_ready(), "server not ready"
    assert c.is_model_ready("dlrm"), "model not ready"
    meta = c.get_model_metadata("dlrm")
    names = {i["name"] for i in meta["inputs"]}
    assert {"dense", "categorical"} <= names, f"metadata inputs: {names}"
    for binary in (False, True):
        inputs = [httpclient.InferInput("dense", list(dense.shape), "BYTES"),
                  httpclient.InferInput("categorical", list(cat.shape), "BYTES")]
        inputs[0].set_data_from_numpy(dense, binary_data=binary)
        inputs[1].set_data_from_numpy(cat, binary_data=binary)
        outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)]
        r = c.infer("dlrm", inputs, outputs=outputs, request_id="tc-1")
        got = r.as_numpy("OUTPUT0")
        assert r.get_response()["id"] == "tc-1", r.get_response()
        assert got.dtype == np.float32 and got.shape == want.shape, (got.dtype, got.shape)
        if not np.array_equal(got.view(np.uint32), want.view(np.uint32)):
            bad = np.nonzero(got != want)[0][:5]
            sys.exit(f"binary={binary}: rows {bad.tolist()} differ: {got[bad].tolist()} vs {want[bad].tolist()}")
        print(f"tritonclient: {len(rows)} rows, binary={binary}: scores equal dlrec predict bit for bit")


if __name__ == "__main__":
    main()
