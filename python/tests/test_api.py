"""The Python package against the CLI (DLREC_BIN): every API call, tabular
sources and Parquet giving the .dlr bytes the CLI writes from the same rows
as CSV, runs interchangeable both ways, the library's errors as DlrecError,
and Ctrl-C stopping a fit with a checkpoint."""
import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dlrec

BIN = os.environ["DLREC_BIN"]


def cli(*args):
    return subprocess.run([BIN, *map(str, args)], check=True, capture_output=True, text=True).stdout


def frame(n=3000, seed=1, nulls=True):
    """Rows with a label, two dense and two categorical columns, some nulls."""
    r = np.random.default_rng(seed)
    city = r.choice(["paris", "lyon", "nice", "oslo, no", 'say "hi"'], n)
    dev = r.choice(["ios", "android", "web"], n)
    x = r.normal(size=n).round(4)
    z = r.exponential(size=n).round(3)
    y = (r.random(n) < 1 / (1 + np.exp(-(x + (dev == "ios"))))).astype(np.int64)
    df = pd.DataFrame({"y": y, "x": x, "z": z, "city": city, "dev": dev})
    if nulls:
        df.loc[r.random(n) < 0.05, "x"] = np.nan
        df.loc[r.random(n) < 0.05, "city"] = None
    return df


SPEC = "label=y;dense=x,z;cat=city,dev"


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("py")


@pytest.fixture(scope="module")
def csv_data(work):
    """The same rows as CSV (pandas), the ETL fit by the CLI, and the CLI's .dlr."""
    df = frame()
    path = work / "rows.csv"
    df.to_csv(path, index=False)
    cli("etl", "fit", "-q", "--format", "csv", "--schema", SPEC, "--input", path, "--out", work / "etl")
    cli("etl", "apply", "-q", "--etl", work / "etl", "--input", path, "--out", work / "cli.dlr")
    return df, path


def read(path):
    with open(path, "rb") as f:
        return f.read()


def test_etl_from_tabular_sources_matches_csv(work, csv_data):
    df, path = csv_data
    # fit from the DataFrame gives the CLI's state: the same .dlr from the CSV.
    rep = dlrec.etl_fit(df, work / "etl_df", schema=SPEC)
    assert rep["rows"] == len(df)
    dlrec.etl_apply(work / "etl_df", path, work / "df_state.dlr")
    assert read(work / "df_state.dlr") == read(work / "cli.dlr")
    # apply from each source, with the CLI's state.
    table = pa.Table.from_pandas(df, preserve_index=False)
    sources = {
        "dataframe": df,
        "table": table,
        "batch": pa.RecordBatch.from_pandas(df, preserve_index=False),
        "dict": {c: df[c].to_numpy() for c in df.columns},
    }
    for name, src in sources.items():
        out = work / f"{name}.dlr"
        dlrec.etl_apply(work / "etl", src, out)
        assert read(out) == read(work / "cli.dlr"), name


def test_workflow_derived_columns_and_memory_budget(work, csv_data):
    """A workflow of derived columns and a memory budget through the package
    (a dict, options by name) gives the CLI's state and rows, the full target
    encoding included."""
    df, path = csv_data
    wf = {"dense": {"x": {"fill_missing": "median"}},
          "cross": [{"columns": ["city", "dev"], "buckets": 7}],
          "bucketize": [{"column": "x", "quantiles": 4}],
          "count": [{"column": "city"}],
          "target": [{"column": "dev", "folds": 3}]}
    (work / "wf.json").write_text(json.dumps(wf))
    cli("etl", "fit", "-q", "--format", "csv", "--schema", SPEC, "--input", path, "--out", work / "wf_cli",
        "--workflow", work / "wf.json")
    dlrec.etl_fit(df, work / "wf_py", schema=SPEC, workflow=wf, memory_mb=1)
    assert read(work / "wf_py" / "vocab.bin") == read(work / "wf_cli" / "vocab.bin")
    cli("etl", "apply", "-q", "--etl", work / "wf_cli", "--input", path, "--out", work / "wf_cli.dlr",
        "--target-encoding", "full")
    dlrec.etl_apply(work / "wf_py", df, work / "wf_py.dlr", target_encoding="full")
    assert read(work / "wf_py.dlr") == read(work / "wf_cli.dlr")
    with pytest.raises(dlrec.DlrecError, match="target_encoding: expected oof or full"):
        dlrec.etl_apply(work / "wf_py", df, work / "bad.dlr", target_encoding="half")


def test_parquet_matches_csv(work, csv_data):
    df, _ = csv_data
    # pyarrow: dictionary-encoded strings, several row groups.
    table = pa.Table.from_pandas(df, preserve_index=False)
    table = table.set_column(table.schema.get_field_index("city"), "city", table.column("city").dictionary_encode())
    pq.write_table(table, work / "a.parquet", row_group_size=700)
    assert pq.ParquetFile(work / "a.parquet").num_row_groups > 1
    # pandas: its own writer, with a categorical column.
    df2 = df.copy()
    df2["dev"] = df2["dev"].astype("category")
    df2.to_parquet(work / "b.parquet", index=False, row_group_size=1000)
    for name in ("a", "b"):
        out = work / f"{name}.dlr"
        dlrec.etl_apply(work / "etl", str(work / f"{name}.parquet"), out)
        assert read(out) == read(work / "cli.dlr"), name
    # The CLI says where Parquet is read.
    p = subprocess.run([BIN, "etl", "apply", "--etl", work / "etl", "--input", work / "a.parquet", "--out",
                        work / "x.dlr"], capture_output=True, text=True)
    assert p.returncode == 2 and "Python package" in p.stderr and "etl_apply" in p.stderr
    # and fit on Parquet, with the schema inferred from the types.
    rep = dlrec.etl_fit(str(work / "a.parquet"), work / "etl_pq", label="y")
    assert rep["rows"] == len(df)


def test_fit_evaluate_predict_export_report_and_cli_interchange(work, csv_data):
    df, path = csv_data
    dlrec.etl_apply(work / "etl", path, work / "train.dlr", valid_fraction=0.2, valid_out=work / "valid.dlr", seed=3)
    cfg = {"model": {"type": "deepfm", "embedding_dim": 4, "mlp": [16]},
           "training": {"batch_size": 64, "epochs": 2, "threads": 1, "seed": 2},
           "eval": {"every_epoch": True}}
    m = dlrec.Model(cfg)
    res = m.fit(str(work / "train.dlr"), str(work / "valid.dlr"), etl=work / "etl", out=work / "run", progress=False)
    assert res["steps"] > 0 and 0.5 < res["valid"]["auc"] <= 1
    assert m.info["type"] == "deepfm"
    met = m.evaluate(str(work / "valid.dlr"))
    assert met["auc"] == pytest.approx(res["valid"]["auc"], abs=1e-12)
    # The CLI reads the Python run: the same metrics and scores.
    cli_met = json.loads(cli("eval", "--model", work / "run", "--data", work / "valid.dlr"))
    assert cli_met["auc"] == met["auc"]
    cli("predict", "-q", "--model", work / "run", "--input", work / "valid.dlr", "--out", work / "cli.scores")
    want = np.loadtxt(work / "cli.scores", dtype=np.float32)
    got = m.predict(str(work / "valid.dlr"))
    assert got.dtype == np.float32 and np.array_equal(got, want)
    # Raw rows as a DataFrame score as the CLI scores the same rows as CSV.
    head = df.head(200)
    head.to_csv(work / "head.csv", index=False)
    cli("predict", "-q", "--model", work / "run", "--input", work / "head.csv", "--out", work / "head.scores")
    assert np.array_equal(m.predict(head), np.loadtxt(work / "head.scores", dtype=np.float32))
    assert np.array_equal(m.predict(head.drop(columns=["y"])), np.loadtxt(work / "head.scores", dtype=np.float32))
    # evaluate on a DataFrame: encoded with the model's own ETL state.
    assert m.evaluate(df)["rows"] == len(df)
    assert os.path.exists(m.export_onnx(work / "m.onnx"))
    assert os.path.getsize(m.report()) > 1000
    # Model.load reads a run the CLI trained.
    with open(work / "cfg.json", "w") as f:
        json.dump(cfg, f)
    cli("train", "-q", "--config", work / "cfg.json", "--train", work / "train.dlr", "--etl", work / "etl", "--out",
        work / "clirun")
    cli("predict", "-q", "--model", work / "clirun", "--input", work / "valid.dlr", "--out", work / "clirun.scores")
    loaded = dlrec.Model.load(work / "clirun")
    assert np.array_equal(loaded.predict(str(work / "valid.dlr")), np.loadtxt(work / "clirun.scores", dtype=np.float32))
    on_cpu = dlrec.Model.load(work / "clirun", threads=1, device="cpu")
    assert np.array_equal(on_cpu.predict(str(work / "valid.dlr")), np.loadtxt(work / "clirun.scores", dtype=np.float32))
    # On cpu-mirror (the CPU run the way a GPU runs: the model's state in the
    # backend's memory) the host API scores the same bits.
    mirrored = dlrec.Model.load(work / "clirun", threads=1, device="cpu-mirror")
    assert np.array_equal(mirrored.predict(str(work / "valid.dlr")), np.loadtxt(work / "clirun.scores", dtype=np.float32))


def test_criteo_model_scores_a_dataframe_by_column_names(work):
    """A model fit on Criteo TSV rows (with derived columns) scores a
    DataFrame whose columns carry the input's names (any order, a label
    column ignored), as dlrec predict scores the TSV rows."""
    cli("synth", "-q", "--rows", 2000, "--seed", 9, "--max-cardinality", 100, "--out", work / "c.tsv")
    # Derived columns: the rows carry the input's columns, not the model's.
    (work / "cwf.json").write_text(json.dumps({"cross": [{"columns": ["C1", "C2"], "buckets": 50}],
                                                "count": [{"column": "C3"}]}))
    cli("etl", "fit", "-q", "--input", work / "c.tsv", "--out", work / "cetl", "--workflow", work / "cwf.json")
    cli("etl", "apply", "-q", "--etl", work / "cetl", "--input", work / "c.tsv", "--out", work / "c.dlr")
    cli("train", "-q", "--train", work / "c.dlr", "--etl", work / "cetl", "--out", work / "crun", "--max-steps", 20)
    cli("predict", "-q", "--model", work / "crun", "--input", work / "c.tsv", "--out", work / "c.scores")
    names = ["label"] + [f"I{i}" for i in range(1, 14)] + [f"C{i}" for i in range(1, 27)]
    df = pd.read_csv(work / "c.tsv", sep="\t", header=None, names=names,
                     dtype={**{f"C{i}": str for i in range(1, 27)}, **{f"I{i}": "Int64" for i in range(1, 14)}})
    m = dlrec.Model.load(work / "crun")
    assert m.info["input_sparse"] == names[14:] and m.info["input_dense"] == names[1:14]
    assert m.info["sparse"] == names[14:] + ["C1_x_C2"] and m.info["dense"] == names[1:14] + ["C3_count"]
    want = np.loadtxt(work / "c.scores", dtype=np.float32)
    assert np.array_equal(m.predict(df[names[::-1]]), want)
    with pytest.raises(dlrec.DlrecError, match="no column 'C7'"):
        m.predict(df.drop(columns=["C7"]))


def test_predict_reads_columns_by_name_and_refuses_bad_data(work, csv_data):
    """Issue 36, findings 1 and 10: a CSV model scores a DataFrame, an Arrow
    table or a CSV file whose columns come in another order (an unknown
    column among them) as it scores the rows in fit's order; a renamed or
    repeated column, None or a list of numbers are refused, naming what is
    wrong."""
    df, _ = csv_data
    run = work / "run"
    assert os.path.exists(run), "the run of test_fit_evaluate_predict_export_report_and_cli_interchange"
    m = dlrec.Model.load(run)
    head = df.head(300)
    want = m.predict(head)
    shuffled = head[["dev", "z", "y", "city", "x"]].assign(extra=np.arange(len(head)))
    assert np.array_equal(m.predict(shuffled), want)
    assert np.array_equal(m.predict(pa.Table.from_pandas(shuffled, preserve_index=False)), want)
    shuffled.to_csv(work / "shuffled.csv", index=False)
    cli("predict", "-q", "--model", run, "--input", work / "shuffled.csv", "--out", work / "shuffled.scores")
    assert np.array_equal(np.loadtxt(work / "shuffled.scores", dtype=np.float32), want)
    with pytest.raises(dlrec.DlrecError, match="no column 'x'"):
        m.predict(head.rename(columns={"x": "xx"}))
    with pytest.raises(dlrec.DlrecError, match="column 'z' more than once"):
        m.predict(pd.concat([head, head[["z"]]], axis=1))
    with pytest.raises(TypeError, match="not NoneType"):
        m.predict(None)
    with pytest.raises(TypeError, match="not list"):
        m.predict([1, 2, 3])
    head.rename(columns={"x": "xx"}).to_csv(work / "renamed.csv", index=False)
    with pytest.raises(dlrec.DlrecError, match="renamed.csv:1: header has no dense column 'x'"):
        m.predict(str(work / "renamed.csv"))


def test_unsupported_arrow_types_are_named(work, csv_data):
    df, _ = csv_data
    t = pa.Table.from_pandas(df, preserve_index=False)
    t = t.append_column("when", pa.array(pd.date_range("2024-01-01", periods=len(df), freq="s")))
    with pytest.raises(dlrec.DlrecError, match="column 'when': Arrow type 'ts"):
        dlrec.etl_fit(t, work / "etl_ts", schema=SPEC + ";ignore=when")


def test_bad_input_gets_the_library_error(work, csv_data):
    df, _ = csv_data
    bad = df.head(50).copy()
    bad["x"] = bad["x"].astype(object)
    bad.loc[bad.index[7], "x"] = "abc"
    with pytest.raises(dlrec.DlrecError, match=r"<DataFrame 0>:9: field 2 \(x\)"):
        dlrec.etl_apply(work / "etl", bad, work / "bad.dlr")
    nan_label = df.head(50).astype({"y": float})
    nan_label.loc[nan_label.index[3], "y"] = np.nan
    with pytest.raises(dlrec.DlrecError, match=r"<DataFrame 0>:5: field 1 \(y\)"):
        dlrec.etl_apply(work / "etl", nan_label, work / "bad.dlr")
    with pytest.raises(dlrec.DlrecError, match="dev"):
        dlrec.etl_apply(work / "etl", df.drop(columns=["dev"]), work / "bad.dlr")
    with pytest.raises(dlrec.DlrecError, match="no such|No such"):
        dlrec.etl_fit(str(work / "missing.tsv"), work / "etl_missing")
    with pytest.raises(dlrec.DlrecError, match="model"):
        dlrec.Model({"model": {"type": "nope"}}).fit(str(work / "cli.dlr"), etl=work / "etl", out=work / "run_bad")
    with pytest.raises(dlrec.DlrecError):
        dlrec.Model.load(work / "no_run")
    with pytest.raises(dlrec.DlrecError, match="device 'gpu' is not one of cpu, cuda, cuda:N"):
        dlrec.Model.load(work / "run", device="gpu")
    with pytest.raises(dlrec.DlrecError, match="device 'tpu'"):
        dlrec.Model({"training": {"batch_size": 64}}).fit(str(work / "train.dlr"), etl=work / "etl",
                                                          out=work / "run_tpu", device="tpu", max_steps=1)
    assert not os.path.exists(work / "run_tpu")
    assert not os.path.exists(work / "bad.dlr")


def test_ctrl_c_stops_fit_with_a_checkpoint(work, csv_data):
    _, path = csv_data
    dlrec.etl_apply(work / "etl", path, work / "all.dlr")
    script = textwrap.dedent(f"""
        import os, signal, sys, dlrec
        cfg = {{"model": {{"type": "dcn_v2", "embedding_dim": 8, "mlp": [256, 256]}},
               "training": {{"batch_size": 16, "epochs": 50, "threads": 1}}}}
        seen = []
        def draw(self, p):  # a Ctrl-C once the run is going
            if p.step >= 20 and not seen:
                seen.append(1)
                os.kill(os.getpid(), signal.SIGINT)
        dlrec._Progress.draw = draw
        try:
            dlrec.Model(cfg).fit({str(work / "all.dlr")!r}, etl={str(work / "etl")!r}, out={str(work / "run_int")!r},
                                 progress=False)
        except KeyboardInterrupt as e:
            print("interrupted:", e)
            sys.exit(0)
        sys.exit("not interrupted")
    """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "interrupted: dlrec: stopped at step" in p.stdout
    step = int(p.stdout.split("stopped at step ")[1].split(";")[0])
    assert 20 <= step < 50 * 3000 // 16
    with open(work / "run_int" / "latest") as f:
        assert f.read().strip() == f"ckpt-{step:012d}"
