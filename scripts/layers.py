#!/usr/bin/env python3
"""Checks the source tree's shape (docs/architecture.md, "Layout"):

  - layers: a file of src/LAYER/ includes headers of its own layer or of
    layers below it, never above:
        core < backend < data, embed, nn < model < dist < train < serve, api < cli
    (data, embed and nn are one level: they may include each other's public
    headers; so may serve and api);
  - private headers (named *_impl.h or *_internal.h, or listed in PRIVATE)
    are included only from their own folder;
  - sizes: no file of src/ over 800 lines, none of src/train/ or
    src/model/ over 600, and no function over 100 lines.

  scripts/layers.py [ROOT]     prints each breach, exit 1 if any, 0 if none

The function lengths are measured from a definition's first line (its return
type, at the start of a line) to its closing brace at the start of a line,
the way this tree is formatted.
"""
import os
import re
import sys

RANK = {"core": 0, "backend": 1, "data": 2, "embed": 2, "nn": 2, "model": 3, "dist": 4, "train": 5,
        "serve": 6, "api": 6, "cli": 7}
# Headers that are their folder's own business, whatever their names say.
PRIVATE = {"model/model_type.h", "model/net_ws.h", "train/trainer_run.h"}
FILE_MAX, FILE_MAX_UPPER, FUNC_MAX = 800, 600, 100
UPPER = ("train", "model")

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
DEF_START = re.compile(r"^[A-Za-z_][\w \t*]*\b(\w+)\s*\([^;]*$")


def private(header):
    name = os.path.basename(header)
    return header in PRIVATE or name.endswith(("_impl.h", "_internal.h"))


def functions(lines):
    """(name, first line, length) of each function definition."""
    out, i = [], 0
    while i < len(lines):
        m = DEF_START.match(lines[i])
        if m and not lines[i].startswith(("typedef", "struct", "enum", "union", "static const", "const ")):
            j = i
            while j < len(lines) and not lines[j].rstrip().endswith("{") and not lines[j].rstrip().endswith(";"):
                j += 1
            if j < len(lines) and lines[j].rstrip().endswith("{") and "=" not in lines[i].split("(")[0]:
                k = j + 1
                while k < len(lines) and not lines[k].startswith("}"):
                    k += 1
                out.append((m.group(1), i + 1, k - i + 1))
                i = k
        i += 1
    return out


def main(argv):
    root = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    src = os.path.join(root, "src")
    breaches = []
    for dirpath, _, names in sorted(os.walk(src)):
        for name in sorted(names):
            if not name.endswith((".c", ".h", ".cu")):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, src)
            layer = rel.split(os.sep)[0]
            with open(path, encoding="utf-8", errors="replace") as f:
                lines = f.read().split("\n")
            limit = FILE_MAX_UPPER if layer in UPPER else FILE_MAX
            if len(lines) - 1 > limit:
                breaches.append(f"src/{rel}: {len(lines) - 1} lines, more than {limit}")
            for n, line in enumerate(lines, 1):
                m = INCLUDE.match(line)
                if not m or "/" not in m.group(1):
                    continue
                target = m.group(1)
                to = target.split("/")[0]
                if to not in RANK or layer not in RANK:
                    continue
                if RANK[to] > RANK[layer]:
                    breaches.append(f"src/{rel}:{n}: includes {target}: {to}/ is a layer above {layer}/")
                elif to != layer and private(target):
                    breaches.append(f"src/{rel}:{n}: includes {target}, private to {to}/")
            if name.endswith((".c", ".cu")):
                for fn, first, length in functions(lines):
                    if length > FUNC_MAX:
                        breaches.append(f"src/{rel}:{first}: {fn} is {length} lines, more than {FUNC_MAX}")
    for b in breaches:
        print(b)
    return 1 if breaches else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
