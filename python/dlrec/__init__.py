"""dlrec from Python: ETL, training, evaluation, prediction, ONNX export and
the training report, over libdlrec's host API (include/dlrec.h).

    import dlrec
    dlrec.etl_fit("clicks.tsv", "etl", min_count=4)
    dlrec.etl_apply("etl", "clicks.tsv", "train.dlr", valid_fraction=0.1, valid_out="valid.dlr")
    m = dlrec.Model({"model": {"type": "deepfm"}})
    m.fit("train.dlr", "valid.dlr", etl="etl", out="run")
    m.evaluate("valid.dlr")["auc"]
    m.predict(df)                      # numpy float32, one probability per row

Runs, checkpoints and ETL states are the CLI's: `dlrec eval --model run`
reads what Model.fit wrote, and Model.load reads what `dlrec train` wrote.
Every failure of the library is a DlrecError carrying its message (file,
line, field). Data may be paths (Criteo TSV, CSV, libSVM, libFM, .dlr,
Parquet), pandas DataFrames, pyarrow Tables, or dicts of numpy arrays;
tabular data reaches the library as CSV (docs/python.md says why and what
that costs)."""
import json
import math
import os
import sys
import tempfile

import numpy as np

from ._lib import ARROW_STREAM_BYTES, ffi, lib

__all__ = ["DlrecError", "Model", "etl_fit", "etl_apply"]
__version__ = "0.1.0"


class DlrecError(Exception):
    """An error of the library, with its message."""


def _fail(rename=None):
    msg = ffi.string(lib.dlrec_api_last_error()).decode("utf-8", "replace")
    for path, name in (rename or {}).items():
        msg = msg.replace(path, name)
    raise DlrecError(msg)


def _take(ptr):
    """A string the library returned, freed; None for NULL."""
    if ptr[0] == ffi.NULL:
        return None
    try:
        return ffi.string(ptr[0]).decode("utf-8")
    finally:
        lib.dlrec_api_free(ptr[0])


def _c(s):
    return ffi.NULL if s is None else os.fsencode(s)


# ---- data sources ------------------------------------------------------------------


def _is_tabular(x):
    mod = type(x).__module__
    return (mod.startswith("pandas") and type(x).__name__ == "DataFrame") or mod.startswith("pyarrow") or \
        isinstance(x, dict) or (isinstance(x, np.ndarray) and x.dtype.names is not None)


def _to_arrow(x):
    """A tabular source as an Arrow table (for its column types)."""
    import pyarrow as pa
    if isinstance(x, (pa.Table, pa.RecordBatch)):
        return x if isinstance(x, pa.Table) else pa.Table.from_batches([x])
    if isinstance(x, np.ndarray):
        return pa.table({n: x[n] for n in x.dtype.names})
    if isinstance(x, dict):
        return pa.table({k: np.asarray(v) for k, v in x.items()})
    return pa.Table.from_pandas(x, preserve_index=False)


def _read_parquet(path):
    import pyarrow.parquet as pq
    return pq.read_table(path)


def _arrow_streams(data):
    """The sources as Arrow C streams of record batches, with their names
    for messages and the buffer that holds the streams (keep it alive for
    the call), when every one is a table pyarrow can hold (a Parquet file is
    streamed row group by row group); None otherwise (a path of rows, no
    pyarrow, or a column Arrow cannot type), for the CSV way."""
    items = data if isinstance(data, (list, tuple)) else [data]
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return None
    readers, names = [], []
    for i, x in enumerate(items):
        if isinstance(x, (str, os.PathLike)):
            if not os.fspath(x).endswith(".parquet"):
                return None
            pf = pq.ParquetFile(os.fspath(x))
            readers.append(pa.RecordBatchReader.from_batches(pf.schema_arrow, pf.iter_batches(batch_size=1 << 16)))
            names.append(os.fspath(x))
        elif _is_tabular(x):
            try:
                t = _to_arrow(x)
            except (TypeError, ValueError, pa.ArrowException):
                return None
            readers.append(pa.RecordBatchReader.from_batches(t.schema, t.to_batches()))
            names.append(f"<{type(x).__name__} {i}>")
        else:
            return None
    buf = ffi.new("char[]", ARROW_STREAM_BYTES * len(readers))
    for k, r in enumerate(readers):
        r._export_to_c(int(ffi.cast("uintptr_t", buf)) + k * ARROW_STREAM_BYTES)
    return ffi.cast("struct ArrowArrayStream *", buf), names, buf


class _Staged:
    """Data sources as paths the library reads: paths stay, Parquet files and
    tabular objects are written as CSV into a temporary directory (removed on
    exit), and error messages name them as the caller knows them."""

    def __init__(self, data, header=True, columns=None):
        self.data = data if isinstance(data, (list, tuple)) else [data]
        self.header, self.columns = header, columns
        self.paths, self.rename, self.tabular = [], {}, False
        self.tmp = None

    def __enter__(self):
        for i, x in enumerate(self.data):
            if isinstance(x, (str, os.PathLike)) and not os.fspath(x).endswith(".parquet"):
                self.paths.append(os.fspath(x))
                continue
            if isinstance(x, (str, os.PathLike)):
                table, name = _read_parquet(os.fspath(x)), os.fspath(x)
            elif _is_tabular(x):
                table, name = x, f"<{type(x).__name__} {i}>"
            else:
                raise TypeError(f"dlrec: cannot read {type(x).__name__} (a path, DataFrame, pyarrow Table, dict of "
                                "arrays or structured array)")
            if self.tmp is None:
                self.tmp = tempfile.TemporaryDirectory(prefix="dlrec-")
            path = os.path.join(self.tmp.name, f"data{i}.csv")
            _write_csv(table, path, self.header, self.columns)
            self.paths.append(path)
            self.rename[path] = name
            self.tabular = True
        return self

    def __exit__(self, *exc):
        if self.tmp is not None:
            self.tmp.cleanup()

    def json(self):
        return json.dumps(self.paths).encode()


def _write_csv(data, path, header, columns):
    """Tabular data as the text the ETL parses: comma-separated with a
    header, or tab-separated without (the Criteo layout) in the given column
    order; nulls as empty fields, floats in their shortest round-trip form,
    booleans as 1 and 0, dictionary-encoded and categorical columns as their
    values. pyarrow writes the text, or pandas (to_csv) when Arrow cannot
    type a column (an object column of mixed values)."""
    names = columns if columns is not None else _column_names(data)
    _require_columns(_column_names(data), names)
    try:
        import pyarrow as pa
    except ImportError:
        pa = None
    table = None
    if type(data).__module__.startswith("pyarrow"):
        table = data if isinstance(data, pa.Table) else pa.Table.from_batches([data])
    elif pa is not None:
        # pyarrow's writer is several times faster than pandas' to_csv; a
        # column Arrow cannot type (mixed objects) falls back to pandas.
        try:
            table = _to_arrow({n: data[n] for n in names} if isinstance(data, dict) else
                              data if isinstance(data, np.ndarray) else data[names])
        except (TypeError, ValueError, pa.ArrowException):
            table = None
    if table is not None:
        import pyarrow.compute as pc
        import pyarrow.csv as pacsv
        cols = {}
        for name in names:
            c = table.column(name)
            if pa.types.is_dictionary(c.type):
                c = c.cast(c.type.value_type)
            if pa.types.is_boolean(c.type):
                c = pc.if_else(c, "1", "0")
            cols[name] = c
        opts = pacsv.WriteOptions(include_header=header, delimiter="," if header else "\t", quoting_style="needed")
        pacsv.write_csv(pa.table(cols), path, write_options=opts)
        return
    import pandas as pd
    if isinstance(data, dict):
        df = pd.DataFrame({k: np.asarray(v) for k, v in data.items()})
    elif isinstance(data, np.ndarray):
        df = pd.DataFrame({n: data[n] for n in data.dtype.names})
    else:
        df = data
    df = df[names]
    for name in names:
        if df[name].dtype == bool:
            df = df.assign(**{name: df[name].astype(np.int64)})
    df.to_csv(path, index=False, header=header, sep="," if header else "\t", na_rep="")


def _require_columns(have, wanted):
    """Refuses, naming them, the columns of wanted that have lacks."""
    missing = [c for c in wanted if c not in have]
    if missing:
        raise DlrecError(f"the data has no column {', '.join(map(repr, missing))} (the model reads "
                         f"{', '.join(wanted)})")


def _select(data, names):
    """The columns names of tabular data, in that order, as the same kind of
    object."""
    if hasattr(data, "select") and hasattr(data, "column_names"):  # pyarrow Table or RecordBatch
        return data.select(names)
    if isinstance(data, dict):
        return {n: data[n] for n in names}
    return data[names]  # a DataFrame, or a structured array's fields


def _column_names(data):
    if hasattr(data, "column_names"):
        return list(data.column_names)
    if isinstance(data, dict):
        return list(data.keys())
    if isinstance(data, np.ndarray):
        return list(data.dtype.names)
    return list(data.columns)


# ---- ETL -------------------------------------------------------------------------------


def _infer_schema(data, label):
    """label=LABEL;dense=<numeric columns>;cat=<the others> from the first
    tabular source's column types."""
    import pyarrow as pa
    first = data[0] if isinstance(data, (list, tuple)) else data
    table = _read_parquet(os.fspath(first)) if isinstance(first, (str, os.PathLike)) else _to_arrow(first)
    dense, cat = [], []
    for f in table.schema:
        if f.name == label:
            continue
        t = f.type.value_type if pa.types.is_dictionary(f.type) else f.type
        (dense if pa.types.is_floating(t) else cat).append(f.name)
    parts = [f"label={label}"] if label in table.column_names else []
    if dense:
        parts.append("dense=" + ",".join(dense))
    if cat:
        parts.append("cat=" + ",".join(cat))
    return ";".join(parts)


def etl_fit(data, out, *, format=None, schema=None, label="label", min_count=1, threads=0, progress=False, **options):
    """Fits vocabularies and dense statistics on data into the directory out
    (`dlrec etl fit`). data: paths (Criteo TSV by default; format="csv",
    "libsvm", "libfm") or tabular sources (DataFrames, pyarrow Tables,
    Parquet files), which are CSV with the given schema SPEC, or by default
    one built from their types: floating-point columns dense, every other
    column categorical, `label` the label. Other options: those of `dlrec
    etl fit`, by the keys of docs/etl.md's option reference: no_label (or
    has_label), hash_buckets, dense_transform ("log", "none"), standardize,
    skip_bad_rows, strict_fields, libfm_fields, pooling ("sum", "mean"),
    max_hotness, raw_keys, max_line_bytes, block_bytes, workflow (a dict of
    column operators and derived columns: cross, bucketize, count, target;
    docs/etl.md), memory_mb (keep the count tables within about that many
    MiB, spilling to disk) and spill_dir.
    Returns the run's report (rows, bad_rows, ...)."""
    def opts_for(tabular):
        nonlocal format, schema
        if tabular:
            if format not in (None, "csv"):
                raise DlrecError(f"tabular data is read as CSV, not {format}")
            format, schema = "csv", schema or _infer_schema(data, label)
        opts = dict(options, format=format or "criteo", min_count=min_count, threads=threads, progress=progress)
        if schema is not None:
            opts["schema"] = schema
        return json.dumps(opts).encode()

    rep = ffi.new("char **")
    arrow = _arrow_streams(data)
    if arrow is not None:
        streams, names, _keep = arrow
        if lib.dlrec_api_etl_fit_arrow(streams, len(names), json.dumps(names).encode(), _c(out), opts_for(True), rep):
            _fail()
        return json.loads(_take(rep))
    with _Staged(data) as st:
        if lib.dlrec_api_etl_fit(st.json(), _c(out), opts_for(st.tabular), rep):
            _fail(st.rename)
        return json.loads(_take(rep))


def etl_apply(etl, data, out, *, valid_fraction=0.0, valid_out=None, seed=0, threads=0, progress=False, **options):
    """Encodes data with the ETL state etl into the .dlr file out (`dlrec etl
    apply`), about valid_fraction of the rows into valid_out. data as for
    etl_fit (tabular sources as CSV with their column names). Other options:
    those of `dlrec etl apply`: no_label, row_group_rows, skip_bad_rows,
    strict_fields, max_line_bytes, block_bytes, target_encoding ("oof", the
    default: out of fold, for fit's own rows in fit's order; "full": for rows
    fit did not see). Returns the report."""
    opts = dict(options, valid_fraction=valid_fraction, seed=seed, threads=threads, progress=progress)
    if valid_out is not None:
        opts["valid_out"] = os.fspath(valid_out)
    opts = json.dumps(opts).encode()
    rep = ffi.new("char **")
    arrow = _arrow_streams(data)
    if arrow is not None:
        streams, names, _keep = arrow
        if lib.dlrec_api_etl_apply_arrow(_c(etl), streams, len(names), json.dumps(names).encode(), _c(out), opts, rep):
            _fail()
        return json.loads(_take(rep))
    with _Staged(data) as st:
        if lib.dlrec_api_etl_apply(_c(etl), st.json(), _c(out), opts, rep):
            _fail(st.rename)
        return json.loads(_take(rep))


# ---- models -------------------------------------------------------------------------


class _Progress:
    """Training progress on stderr, a line redrawn in place (a terminal or a
    notebook), and Ctrl-C turned into a stop request: Python runs its SIGINT
    handler when the callback runs Python code, so KeyboardInterrupt lands
    here, and the run stops after its step with a checkpoint. An exception
    that escapes (raised between two lines of this code) takes the same way
    through onerror."""

    def __init__(self, show):
        self.show, self.interrupted, self.error = show, False, None

    def __call__(self, ctx, p):
        try:
            self.draw(p)
            return 0
        except KeyboardInterrupt:
            self.interrupted = True
            return 1

    def onerror(self, exc_type, exc, tb):
        if issubclass(exc_type, KeyboardInterrupt):
            self.interrupted = True
        else:
            self.error = exc
        return 1

    def draw(self, p):
        if not self.show:
            return
        pct = f"{100.0 * p.samples / p.total_samples:5.1f}% " if p.total_samples else ""
        loss = "" if math.isnan(p.loss) else f" loss {p.loss:.4f}"
        auc = "" if math.isnan(p.valid_auc) else f" auc {p.valid_auc:.4f}"
        end = "\n" if p.done else ""
        sys.stderr.write(f"\rtrain {pct}step {p.step}{loss}{auc} {p.samples_per_s:,.0f} samples/s{end}")
        sys.stderr.flush()


class Model:
    """A model: its config before training, its run after."""

    def __init__(self, config=None):
        """config: a dict (docs/config.md), a path to a JSON config, or None
        for the defaults (the Criteo Kaggle DLRM)."""
        if isinstance(config, (str, os.PathLike)):
            with open(config) as f:
                config = json.load(f)
        self.config = config
        self.run = None
        self._m = None
        self._threads = 0
        self._device = None

    @classmethod
    def load(cls, run, checkpoint="latest", threads=0, device=None):
        """The model of a run directory (its latest or best checkpoint) or of
        a checkpoint directory, as the CLI's --model takes them, scoring on
        threads threads (0: every core) of device ("cpu", "cuda", "cuda:N";
        None: the CPU)."""
        m = cls()
        m.run = os.fspath(run)
        m._threads, m._device = threads, device
        m._open(checkpoint)
        return m

    def _open(self, which="latest"):
        if self._m is not None:
            lib.dlrec_api_model_free(self._m)
            self._m = None
        if self.run is None:
            raise DlrecError("the model has not been trained: call fit, or Model.load a run")
        m = lib.dlrec_api_model_load(_c(self.run), _c(which), self._threads, _c(self._device))
        if m == ffi.NULL:
            _fail()
        self._m = m
        return m

    def _model(self):
        return self._m if self._m is not None else self._open()

    def __del__(self):
        if getattr(self, "_m", None) is not None:
            lib.dlrec_api_model_free(self._m)
            self._m = None

    @property
    def info(self):
        """type, checkpoint, step, format, has_label, label, dense, sparse."""
        ptr = ffi.new("char **")
        ptr[0] = lib.dlrec_api_model_info(self._model())
        return json.loads(_take(ptr))

    def fit(self, train, valid=None, *, etl, out, resume=False, threads=0, device=None, max_steps=0,
            deterministic=False, progress=True):
        """Trains on the .dlr files train (a path or a list), validating on
        valid, with the ETL state etl, into the run directory out (`dlrec
        train`), on device ("cpu", "cuda", "cuda:N"; None: the config's
        training.device). Tabular data (DataFrames, Tables, Parquet) is encoded with
        etl first. Returns what `dlrec train` prints. Ctrl-C stops after the
        current step with a checkpoint and raises KeyboardInterrupt;
        fit(..., resume=True) goes on from there."""
        out = os.fspath(out)
        with tempfile.TemporaryDirectory(prefix="dlrec-") as tmp:
            train = self._encoded(train, etl, os.path.join(tmp, "train.dlr"))
            if valid is not None:
                valid = self._encoded(valid, etl, os.path.join(tmp, "valid.dlr"))[0]
            args = {"train": train, "etl": os.fspath(etl), "out": out, "resume": bool(resume), "threads": threads,
                    "max_steps": max_steps, "deterministic": bool(deterministic)}
            if valid is not None:
                args["valid"] = valid
            if device is not None:
                args["device"] = device
            cfg = None if self.config is None else json.dumps(self.config).encode()
            prog = _Progress(progress)
            cb = ffi.callback("int(void *, const dlrec_api_progress *)", prog, error=1, onerror=prog.onerror)
            res = ffi.new("char **")
            rc = lib.dlrec_api_train(cfg if cfg is not None else ffi.NULL, json.dumps(args).encode(), cb, ffi.NULL,
                                     res)
        if rc:
            _fail()
        self.run = out
        if self._m is not None:
            self._open()
        result = json.loads(_take(res))
        if prog.error is not None:
            raise prog.error
        if prog.interrupted:
            raise KeyboardInterrupt(f"dlrec: stopped at step {result['steps']}; the checkpoint is in {out} "
                                    "(fit(..., resume=True) goes on)")
        return result

    @staticmethod
    def _encoded(data, etl, path):
        """.dlr paths as they are; anything else encoded with etl into path."""
        items = data if isinstance(data, (list, tuple)) else [data]
        if all(isinstance(x, (str, os.PathLike)) and os.fspath(x).endswith(".dlr") for x in items):
            return [os.fspath(x) for x in items]
        etl_apply(etl, data, path)
        return [path]

    def evaluate(self, data, max_rows=0):
        """AUC, logloss, NE, calibration and the reliability curve on labeled
        data (`dlrec eval`): a .dlr file, or raw data encoded with the
        model's own ETL state first."""
        m = self._model()
        with tempfile.TemporaryDirectory(prefix="dlrec-") as tmp:
            if not (isinstance(data, (str, os.PathLike)) and os.fspath(data).endswith(".dlr")):
                path = os.path.join(tmp, "data.dlr")
                etl_apply(os.path.join(self.info["checkpoint"], "etl"), data, path)
                data = path
            met = ffi.new("char **")
            if lib.dlrec_api_evaluate(m, _c(data), max_rows, met):
                _fail()
        return json.loads(_take(met))

    def predict(self, data):
        """One click probability per row (numpy float32, in input order): a
        .dlr file, raw rows in the model's input format (a path), or tabular
        data with the model's column names (the label column, if any, is
        ignored), as `dlrec predict` scores them."""
        m = self._model()
        info = self.info
        if isinstance(data, (str, os.PathLike)):
            pass
        elif not _is_tabular(data):
            raise TypeError(f"dlrec: predict reads a path, DataFrame, pyarrow Table, dict of arrays or structured "
                            f"array, not {type(data).__name__}")
        else:
            # Only the columns the model reads, checked by name before any
            # row is formatted: the label if there, the input's features.
            names = _column_names(data)
            seen, dup = set(), []
            for c in names:
                if c in seen and c not in dup:
                    dup.append(c)
                seen.add(c)
            if dup:
                raise DlrecError(f"the data has column {', '.join(map(repr, dup))} more than once")
            wanted = info["input_dense"] + info["input_sparse"]
            _require_columns(seen, wanted)
            label = info.get("label")
            data = _select(data, ([label] if label is not None and label in seen else []) + wanted)
        prob, n = ffi.new("float **"), ffi.new("uint64_t *")
        arrow = _arrow_streams(data)  # tabular data, or a Parquet file streamed by row group
        if arrow is not None:
            streams, names, _keep = arrow
            if lib.dlrec_api_predict_arrow(m, streams, names[0].encode(), prob, n):
                _fail()
            return self._scores(prob, n)
        header, columns, no_label = True, None, False
        if info["format"] == "criteo" and not isinstance(data, (str, os.PathLike)):
            # The Criteo layout: label first if present, then the dense and
            # categorical columns by name, tab-separated without a header.
            header, columns = False, info["input_dense"] + info["input_sparse"]
            no_label = True
        elif not isinstance(data, (str, os.PathLike)):
            label = info.get("label")
            no_label = label is None or label not in _column_names(data)
        with _Staged(data, header=header, columns=columns) as st:
            if lib.dlrec_api_predict(m, _c(st.paths[0]), int(no_label), prob, n):
                _fail(st.rename)
        return self._scores(prob, n)

    @staticmethod
    def _scores(prob, n):
        try:
            return np.frombuffer(ffi.buffer(prob[0], n[0] * 4), dtype=np.float32).copy()
        finally:
            lib.dlrec_api_free(prob[0])

    def export_onnx(self, path):
        """The model as ONNX (docs/export.md)."""
        if lib.dlrec_api_export_onnx(self._model(), _c(path)):
            _fail()
        return os.fspath(path)

    def report(self, out=None):
        """Rebuilds the run's report.html and returns its path."""
        if self.run is None:
            raise DlrecError("the model has no run: call fit, or Model.load a run")
        if lib.dlrec_api_report(_c(self.run), _c(out)):
            _fail()
        return os.fspath(out) if out else os.path.join(self.run, "report.html")
