#!/usr/bin/env python3
"""bench/fuxictr_vs.sh's results: dlrec's run in run_fuxictr.py's format, and the tables.

usage:
  report.py dlrec RUN SUMMARY.json TEST_EVAL.json > RESULT.json
  report.py table RESULTS_DIR [--cpu LINE] [--note LINE]

dlrec: the per-epoch validation AUC and logloss from RUN/metrics.jsonl (the lines with
"epoch_end": true), the best epoch (the first of the highest AUC, as FuxiCTR keeps it),
the test AUC and logloss of RUN/best (`dlrec eval --checkpoint best`), and samples/s of
the training loop (`dlrec train`'s summary: validations excluded).

table: for every RESULTS_DIR/DATASET/MODEL.{dlrec,fuxictr}.json, one table per data set
(printed, and written with everything else to RESULTS_DIR/results.md and results.json),
and whether the goals hold: test AUC at most 0.002 below FuxiCTR's, per-epoch validation
AUC within 0.005 from epoch 4 on (the epochs both ran), dlrec's samples/s >= 3x.
"""
import glob
import json
import os
import sys

MODELS = ["lr", "fm", "dnn", "wide_deep", "deepfm", "dcn_v2", "dlrm"]


def dlrec(run, summary, test):
    lines = [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl"))]
    ep = [j for j in lines if j.get("epoch_end") and "valid" in j]
    aucs = [j["valid"]["auc"] for j in ep]
    s = json.load(open(summary))
    t = json.load(open(test))
    return {"engine": "dlrec", "valid_auc": aucs, "valid_logloss": [j["valid"]["logloss"] for j in ep],
            "best_epoch": aucs.index(max(aucs)) + 1 if aucs else 0, "epochs_run": len(aucs),
            "test_auc": t["auc"], "test_logloss": t["logloss"], "train_rows": s["samples"],
            "train_s": s["seconds"], "samples_per_s": s["samples_per_s"]}


def goals(d, f):
    test_ok = d["test_auc"] >= f["test_auc"] - 0.002
    late = [abs(a - b) for a, b in list(zip(d["valid_auc"], f["valid_auc"]))[3:]]
    curve_ok = all(x <= 0.005 for x in late)
    ratio = d["samples_per_s"] / f["samples_per_s"] if f["samples_per_s"] else 0
    return {"test_auc_gap": d["test_auc"] - f["test_auc"], "max_valid_gap_after_3": max(late) if late else None,
            "speed_ratio": ratio, "test_ok": test_ok, "curve_ok": curve_ok, "speed_ok": ratio >= 3}


def table(results, cpu, note):
    out = {"cpu": cpu, "note": note, "datasets": {}}
    md = ["# dlrec against FuxiCTR", "", cpu, ""] + ([note, ""] if note else [])
    for ds_dir in sorted(glob.glob(os.path.join(results, "*/"))):
        ds = os.path.basename(ds_dir.rstrip("/"))
        info_path = os.path.join(ds_dir, "info.json")
        info = json.load(open(info_path)) if os.path.exists(info_path) else {}
        rows = []
        for m in MODELS:
            try:
                d = json.load(open(os.path.join(ds_dir, m + ".dlrec.json")))
                f = json.load(open(os.path.join(ds_dir, m + ".fuxictr.json")))
            except (OSError, ValueError):
                continue
            rows.append((m, d, f, goals(d, f)))
        if not rows:
            continue
        out["datasets"][ds] = {"info": info, "models": {m: {"dlrec": d, "fuxictr": f, "goals": g}
                                                         for m, d, f, g in rows}}
        head = "%s: %s train / %s valid / %s test rows" % (ds, *[info.get("rows", {}).get(k, "?")
                                                                for k in ("train", "valid", "test")])
        if "oracle_test_auc" in info:
            head += "; AUC of the true probabilities on test: %.4f" % info["oracle_test_auc"]
        md += ["## " + head, "",
               "| model | valid AUC per epoch, dlrec / FuxiCTR | best epoch | test AUC | test logloss "
               "| samples/s | ratio | goals |", "|---|---|---|---|---|---|---|---|"]
        for m, d, f, g in rows:
            n = max(len(d["valid_auc"]), len(f["valid_auc"]))
            ep = " ".join("%s/%s" % tuple("%.4f" % v[i] if i < len(v) else "-" for v in (d["valid_auc"], f["valid_auc"]))
                          for i in range(n))
            bad = [k for k, ok in (("test", g["test_ok"]), ("curve", g["curve_ok"]), ("speed", g["speed_ok"])) if not ok]
            md.append("| %s | %s | %d / %d | %.4f / %.4f (%+.4f) | %.4f / %.4f | %.0f / %.0f | %.1fx | %s |" % (
                m, ep, d["best_epoch"], f["best_epoch"], d["test_auc"], f["test_auc"], g["test_auc_gap"],
                d["test_logloss"], f["test_logloss"], d["samples_per_s"], f["samples_per_s"], g["speed_ratio"],
                "met" if not bad else "not met: " + ",".join(bad)))
        md.append("")
    text = "\n".join(md)
    with open(os.path.join(results, "results.md"), "w") as fh:
        fh.write(text + "\n")
    with open(os.path.join(results, "results.json"), "w") as fh:
        json.dump(out, fh, indent=2)
    print(text)


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "dlrec":
        print(json.dumps(dlrec(*sys.argv[2:])))
    elif len(sys.argv) >= 3 and sys.argv[1] == "table":
        args = sys.argv[3:]
        opt = dict(zip(args[::2], args[1::2]))
        table(sys.argv[2], opt.get("--cpu", ""), opt.get("--note", ""))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
