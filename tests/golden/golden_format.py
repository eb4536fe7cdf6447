"""What every golden-file generator here shares: the file format that
tests/test_golden.c reads, and float32 rounding. The models themselves stay
in their own scripts, each an independent NumPy implementation.

A file is '#' comments, the line "dlrec-MODEL-golden 1", then sections
"@NAME TYPE COUNT" (TYPE i: integers, f: floats) each followed by COUNT
whitespace-separated values."""
import numpy as np


def f32(a):
    """a rounded to float32, kept as float64: the values dlrec will hold."""
    return np.asarray(a, dtype=np.float64).astype(np.float32).astype(np.float64)


def fmt(values, kind, per_line=6):
    """kind "i": integers, 16 a line; "f32": floats that round-trip float32
    exactly; otherwise floats that round-trip float64."""
    if kind == "i":
        toks = [str(int(v)) for v in values]
        per_line = 16
    elif kind == "f32":
        toks = ["%.9g" % float(v) for v in values]
    else:
        toks = ["%.17g" % float(v) for v in values]
    return "\n".join(" ".join(toks[i:i + per_line]) for i in range(0, len(toks), per_line))


class Sections:
    """The sections of one file, in the order added."""

    def __init__(self):
        self.items = []

    def add(self, name, kind, values):
        values = list(np.asarray(values).ravel())
        head = f"@{name} {'i' if kind == 'i' else 'f'} {len(values)}"
        self.items.append(f"{head}\n{fmt(values, kind)}" if values else head)

    def text(self, header, model):
        """The file: the comment header, the format line, the sections."""
        return header + f"dlrec-{model}-golden 1\n" + "\n".join(self.items) + "\n"
