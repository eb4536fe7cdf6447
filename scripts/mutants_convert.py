#!/usr/bin/env python3
"""One-off: tests/mutants/*.patch (unified diffs) -> tests/mutants/*.mut
(sections anchored by context, scripts/mutant_apply.py).

For each hunk the find block is its changed lines and the context between
them, extended by the hunk's context lines above and below, one at a time
(above first), until it matches at exactly one place in the file as the
previous hunks of the patch left it. A pure insertion gets at least one
context line as its anchor.

  mutants_convert.py ROOT PATCH...   writes PATCH's .mut beside it
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mutant_apply as ma  # noqa: E402


def parse_patch(path):
    """-> (header lines, [(file path, [hunk body [(op, text)]])])"""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    if lines[-1] == "":
        lines.pop()
    i = 0
    header = []
    while i < len(lines) and not lines[i].startswith(("diff ", "--- ")):
        header.append(lines[i])
        i += 1
    files = []
    while i < len(lines):
        line = lines[i]
        if line.startswith("+++ "):
            target = line[4:].split("\t")[0]
            assert target.startswith("b/"), (path, line)
            files.append((target[2:], []))
            i += 1
        elif line.startswith("@@ "):
            m = re.match(r"@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@", line)
            old_n = int(m.group(1) or 1)
            new_n = int(m.group(2) or 1)
            body = []
            i += 1
            while old_n > 0 or new_n > 0:
                t = lines[i]
                op, text = (t[:1] or " "), t[1:]
                assert op in " -+", (path, i, t)
                if op != "+":
                    old_n -= 1
                if op != "-":
                    new_n -= 1
                body.append((op, text))
                i += 1
            assert i >= len(lines) or not lines[i].startswith("\\"), (path, "no newline marker")
            files[-1][1].append(body)
        else:
            assert line.startswith(("diff ", "index ", "--- ")), (path, line)
            i += 1
    return header, files


def section(content, body):
    changed = [k for k, (op, _) in enumerate(body) if op != " "]
    i0, i1 = changed[0], changed[-1]
    above, below = i0, len(body) - 1 - i1  # context lines available
    a = b = 0
    while True:
        sec = body[i0 - a:i1 + 1 + b]
        block = [t for op, t in sec if op != "+"]
        if block and len(ma.find(content, block)) == 1:
            return sec
        if a < above and (a <= b or b == below):
            a += 1
        elif b < below:
            b += 1
        else:
            n = len(ma.find(content, block)) if block else 0
            raise ma.MutantError(f"not unique even with all the hunk's context ({n} matches)")


def convert(root, patch):
    header, files = parse_patch(patch)
    out = list(header)
    for target, hunks in files:
        with open(os.path.join(root, target), "rb") as f:
            content = ma.split_lines(f.read().decode("utf-8", errors="surrogateescape"))
        for body in hunks:
            try:
                sec = section(content, body)
            except ma.MutantError as e:
                raise ma.MutantError(f"{os.path.basename(patch)}: {target}: {e}")
            content = ma.apply_section(content, sec)
            out.append(f"@@ {target}")
            out.extend(op + t for op, t in sec)
    mut = patch[:-len(".patch")] + ".mut"
    with open(mut, "w", encoding="utf-8") as f:
        f.write("\n".join(out) + "\n")


def main(argv):
    root, bad = argv[1], 0
    for p in argv[2:]:
        try:
            convert(root, p)
        except ma.MutantError as e:
            print(e)
            bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
