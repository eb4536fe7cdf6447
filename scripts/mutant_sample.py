#!/usr/bin/env python3
"""Mutants drawn mechanically from a change, not chosen by its author.

  scripts/mutant_sample.py [--base REV] [-n N] [--seed S] [--out DIR] [--files PATH...]

Takes the lines of src/*.c that the working tree adds since REV (default
HEAD~1; CUDA sources left out, since no test here runs them), draws N of
them at random (seeded: the same draw again for the same tree and seed), and
writes for each one mutant in tests/mutants/'s anchored format
(scripts/mutate.sh --help): one operator or constant of the line changed,
as a careless edit would (a comparison flipped or widened, + for -, && for
||, a 0 for a 1, a negation dropped, a success returned as an error). The
mutant names the unit tests of its file's layer (`# tests:`). Lines that
occur more than once in their file are skipped (a mutant must anchor once).

Then `scripts/mutate.sh DIR/*.mut` runs them; report its score with the
seed and the base, and judge each survivor: a test that asserts too little,
or an equivalent mutant (say which, and why).

With --files, the lines drawn from are every code line of those files (a
file's tests strengthened without a change to it), not a change's.
"""
import argparse
import os
import random
import re
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
# (pattern, replacement) pairs: each a careless edit of one token.
EDITS = [(r" < ", " <= "), (r" <= ", " < "), (r" > ", " >= "), (r" >= ", " > "), (r" == ", " != "),
         (r" != ", " == "), (r" \+ ", " - "), (r" - ", " + "), (r" && ", " || "), (r" \|\| ", " && "),
         (r"\b1\b", "0"), (r"\b0\b", "1"), (r"\+\+", "--"), (r"return DLREC_OK;", "return DLREC_ERR_INVALID;"),
         (r"!(?!=)", ""), (r" \* ", " / ")]
# The tests that cover each layer of src/ (tests/test_*.c names, or the
# script tests scripts/mutate.sh knows).
TESTS = {
    "core": "test_core test_etl",
    "backend": "test_backend test_embed test_nn test_linear_packed test_precision",
    "data": "test_etl test_loader test_parse test_dlr",
    "embed": "test_store test_embed",
    "nn": "test_nn_blocks test_models test_dlrm",
    "model": "test_models test_dlrm test_golden",
    "dist": "test_comm dist_mpi",
    "train": "test_train test_checkpoint test_train_config",
    "serve": "test_serve_units test_kserve test_serve",
    "api": "test_api python",
}
EXTRA = {"src/backend/cpu/sparse_update.c": " test_sparse_dense optim_ref",
         "src/backend/sparse_optim.c": " test_sparse_dense", "src/train/trainer_setup.c": " test_sparse_dense",
         "src/core/options.c": " test_train_config", "src/model/embedding_init.c": " test_train_config test_train",
         "src/model/registry.c": " test_train_config",
         "src/train/step.c": " dist_mpi", "src/train/trainer_ranks.c": " dist_mpi",
         "src/core/redis_rows.c": " test_redis", "src/serve/redis_tier.c": " test_redis",
         "src/train/publish.c": " test_redis", "src/train/predict.c": " python",
         "src/data/etl_encode.c": " test_train python test_serve", "src/data/arrow_csv.c": " test_arrow",
         "src/core/hash.c": " test_store", "src/core/onnx.c": " onnx_export",
         "src/model/export_onnx.c": " onnx_export", "src/data/dlr_read.c": " test_train",
         "src/serve/prom.c": " test_redis", "src/cli/cmd_train.c": "test_train",
         "src/cli/cmd_serve.c": "test_serve"}


def added_lines(base):
    diff = subprocess.run(["git", "-C", ROOT, "diff", "-U0", base, "--", "src/"], capture_output=True, text=True,
                          check=True).stdout
    out, path = [], None
    for line in diff.splitlines():
        if line.startswith("+++ "):
            path = None if line == "+++ /dev/null" else line[6:]
        elif path and line.startswith("+") and path.endswith(".c") and not path.startswith("src/backend/cuda/"):
            text = line[1:]
            stripped = text.strip()
            if stripped and not stripped.startswith(("/*", "*", "//", "#")):
                out.append((path, text))
    return out


def file_lines(paths):
    out = []
    for path in paths:
        with open(os.path.join(ROOT, path)) as f:
            for text in f.read().splitlines():
                stripped = text.strip()
                if stripped and not stripped.startswith(("/*", "*", "//", "#")):
                    out.append((path, text))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="HEAD~1")
    ap.add_argument("-n", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=os.path.join(ROOT, "build-mutate", "sampled"))
    ap.add_argument("--files", nargs="+", metavar="PATH", help="draw from every code line of these src/ files")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    lines = file_lines(a.files) if a.files else added_lines(a.base)
    rng.shuffle(lines)
    os.makedirs(a.out, exist_ok=True)
    made = 0
    for path, text in lines:
        if made == a.n:
            break
        edits = [(p, r) for p, r in EDITS if re.search(p, text)]
        if not edits:
            continue
        p, r = rng.choice(edits)
        m = rng.choice(list(re.finditer(p, text)))
        mutated = text[:m.start()] + re.sub(p, r, m.group(0)) + text[m.end():]
        with open(os.path.join(ROOT, path)) as f:
            if sum(1 for l in f if l.strip() == text.strip()) != 1:
                continue
        layer = path.split("/")[1]
        name = os.path.join(a.out, f"s{a.seed}_{made:02d}.mut")
        with open(name, "w") as f:
            origin = "files" if a.files else f"base {a.base}"
            f.write(f"# sampled (seed {a.seed}, {origin}): {path}: '{m.group(0).strip()}' edited\n")
            tests = TESTS.get(layer, "") + EXTRA.get(path, "")
            if tests:
                f.write(f"# tests: {tests.strip()}\n")
            f.write(f"@@ {path}\n-{text}\n+{mutated}\n")
        made += 1
    print(f"mutant_sample: {made} mutants from {len(lines)} {'code' if a.files else 'added'} lines into {a.out}")
    return 0 if made else 1


if __name__ == "__main__":
    sys.exit(main())
