#!/usr/bin/env python3
"""Applies and checks the mutants of tests/mutants/*.mut (scripts/mutate.sh).

A mutant is anchored by context, not by line numbers, so that moving code
never forces re-making it. After its header of `#` lines (the first is the
description, `# tests: ...` names the tests) it holds one or more sections:

    @@ src/backend/cpu/rows.c
    -  for (size_t i = 0; i < n; i++) y[i] += x[i];
    +  for (size_t i = 0; i < n; i++) y[i] = x[i];

`@@ PATH` names a file relative to the tree's root; then lines that begin
with ' ' (context), '-' (removed) or '+' (added), like a unified-diff hunk
without line numbers. An empty line counts as an empty context line (editors
strip the lone space), except at the end of a section. The section's find
block is its ' ' and '-' lines in order, its replacement its ' ' and '+'
lines. Lines match whole, with leading and trailing whitespace ignored, and
the find block must match at exactly one place in the file as the previous
sections left it (several sections may name one file; they apply in order).
Context lines stay as they are in the file; '+' lines are written verbatim.

  mutant_apply.py apply [--root DIR] MUTANT      mutate the tree (all or nothing)
  mutant_apply.py check [--root DIR] [MUTANT...] every mutant (default: all of
                                                 DIR/tests/mutants/*.mut)
                                                 anchors exactly once; prints
                                                 the ones that do not, exit 1
  mutant_apply.py files MUTANT                   the paths it touches, one a line
  mutant_apply.py relocate [--root DIR] [MUTANT...]
                                                 for each section whose find block
                                                 no longer anchors in its file, the
                                                 one other file of the tree's src/,
                                                 tests/ and include/ where it anchors
                                                 exactly once becomes its @@ path
                                                 (code moved to another file); says
                                                 what it moved and what it could not

--root defaults to the current directory. Exit status 2 on a usage error.
"""
import glob
import os
import sys


class MutantError(Exception):
    pass


def parse(path):
    """-> (header lines, [(file path, [(op, text)])])"""
    name = os.path.basename(path)
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    header, sections = [], []
    for n, line in enumerate(lines, 1):
        if line.startswith("@@"):
            target = line[2:].strip()
            if not target:
                raise MutantError(f"{name}:{n}: `@@` without a path")
            if os.path.isabs(target) or ".." in target.split("/"):
                raise MutantError(f"{name}:{n}: {target}: the path must lie inside the tree")
            sections.append((target, []))
        elif not sections:
            if line.startswith("#") or not line.strip():
                header.append(line)
            else:
                raise MutantError(f"{name}:{n}: before the first `@@ PATH` only `#` lines may stand")
        elif line == "" or line[0] in " -+":
            # "e": an empty line, a context line unless it ends the section
            sections[-1][1].append((line[:1] or "e", line[1:]))
        else:
            raise MutantError(f"{name}:{n}: a section's lines begin with ' ', '-' or '+'")
    if not sections:
        raise MutantError(f"{name}: no `@@ PATH` section")
    for target, body in sections:
        while body and body[-1][0] == "e":
            body.pop()
        body[:] = [(" " if op == "e" else op, t) for op, t in body]
        if not any(op != " " for op, _ in body):
            raise MutantError(f"{name}: @@ {target}: the section changes nothing")
        if not any(op != "+" for op, _ in body):
            raise MutantError(f"{name}: @@ {target}: no ' ' or '-' line to anchor the added lines")
    return header, sections


def split_lines(text):
    """Lines with their newlines; only "\n" ends a line (not a form feed)."""
    lines = text.split("\n")
    return [line + "\n" for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])


def find(content, block):
    """Start indexes of the places where the stripped lines of block match."""
    keys = [t.strip() for t in block]
    stripped = [line.strip() for line in content]
    first, m = keys[0], len(keys)
    return [i for i in range(len(stripped) - m + 1)
            if stripped[i] == first and stripped[i:i + m] == keys]


def apply_section(content, body):
    """content (lines with their endings) with the section body applied;
    raises MutantError saying how often the find block matched when not once."""
    block = [t for op, t in body if op != "+"]
    at = find(content, block)
    if len(at) != 1:
        lines = ", ".join(str(i + 1) for i in at[:5]) + ("..." if len(at) > 5 else "")
        where = "nowhere" if not at else f"{len(at)} times (at lines {lines})"
        raise MutantError(f"the find block of {len(block)} lines matches {where}, not once")
    i, out = at[0], []
    for op, t in body:
        if op == " ":
            out.append(content[i])
            i += 1
        elif op == "-":
            i += 1
        else:
            out.append(t + "\n")
    # The file keeps its last line without a newline if it had one.
    if i == len(content) and out and not content[-1].endswith("\n") and out[-1].endswith("\n"):
        out[-1] = out[-1][:-1]
    return content[:at[0]] + out + content[i:]


def mutate(path, root):
    """-> {file path: (old bytes, new bytes)}; raises MutantError naming the
    mutant, the file and the number of matches when a section does not anchor."""
    name = os.path.basename(path)
    _, sections = parse(path)
    files = {}
    for target, body in sections:
        if target not in files:
            full = os.path.join(root, target)
            try:
                with open(full, "rb") as f:
                    old = f.read()
            except OSError as e:
                raise MutantError(f"{name}: {target}: {e.strerror}")
            text = old.decode("utf-8", errors="surrogateescape")
            files[target] = (old, split_lines(text))
        old, content = files[target]
        try:
            files[target] = (old, apply_section(content, body))
        except MutantError as e:
            raise MutantError(f"{name}: {target}: {e}")
    result = {}
    for target, (old, content) in files.items():
        new = "".join(content).encode("utf-8", errors="surrogateescape")
        if new == old:
            raise MutantError(f"{name}: {target}: the mutant leaves the file as it was")
        result[target] = (old, new)
    return result


def relocate(path, root):
    """Rewrites the @@ paths of path's sections whose block now anchors once
    in another file (and nowhere in its own); -> [messages]."""
    name = os.path.basename(path)
    _, sections = parse(path)
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    candidates = None
    said, moved = [], {}
    for target, body in sections:
        block = [t for op, t in body if op != "+"]
        try:
            with open(os.path.join(root, target), encoding="utf-8", errors="surrogateescape") as f:
                here = len(find(split_lines(f.read()), block))
        except OSError:
            here = 0
        if here == 1:
            continue
        if candidates is None:
            candidates = []
            for top in ("src", "tests", "include", "bench"):
                for dirpath, _, names in os.walk(os.path.join(root, top)):
                    candidates += [os.path.join(dirpath, n) for n in names
                                   if n.endswith((".c", ".h", ".cu", ".py", ".sh"))]
        hits = []
        for c in candidates:
            with open(c, encoding="utf-8", errors="surrogateescape") as f:
                if len(find(split_lines(f.read()), block)) == 1:
                    hits.append(os.path.relpath(c, root))
        if here == 0 and len(hits) == 1:
            moved[target] = hits[0]
            said.append(f"{name}: @@ {target} -> {hits[0]}")
        else:
            said.append(f"{name}: @@ {target}: matches {here} times there and once in {len(hits)} other files: "
                        "re-anchor it by hand")
    if moved:
        out = [("@@ " + moved.get(line[2:].strip(), line[2:].strip())) if line.startswith("@@") else line
               for line in lines]
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n".join(out))
    return said


def main(argv):
    args, root = [], "."
    it = iter(argv[1:])
    for a in it:
        if a == "--root":
            root = next(it, None)
            if root is None:
                return usage()
        elif a in ("-h", "--help"):
            print(__doc__.strip())
            return 0
        else:
            args.append(a)
    if not args or args[0] not in ("apply", "check", "files", "relocate"):
        return usage()
    mode, mutants = args[0], args[1:]
    if mode == "apply":
        if len(mutants) != 1:
            return usage()
        try:
            for target, (_, new) in mutate(mutants[0], root).items():
                with open(os.path.join(root, target), "wb") as f:
                    f.write(new)
        except (MutantError, OSError) as e:
            print(f"mutant_apply: {e}", file=sys.stderr)
            return 1
        return 0
    if mode == "files":
        if len(mutants) != 1:
            return usage()
        try:
            _, sections = parse(mutants[0])
        except (MutantError, OSError) as e:
            print(f"mutant_apply: {e}", file=sys.stderr)
            return 1
        seen = []
        for target, _ in sections:
            if target not in seen:
                seen.append(target)
                print(target)
        return 0
    if not mutants:
        mutants = sorted(glob.glob(os.path.join(root, "tests", "mutants", "*.mut")))
    if mode == "relocate":
        for m in mutants:
            try:
                for line in relocate(m, root):
                    print(line)
            except (MutantError, OSError) as e:
                print(f"mutant_apply: {e}", file=sys.stderr)
                return 1
        return 0
        if not mutants:
            print(f"mutant_apply: no mutants in {root}/tests/mutants", file=sys.stderr)
            return 1
    bad = 0
    for m in mutants:
        try:
            mutate(m, root)
        except (MutantError, OSError) as e:
            print(f"mutant_apply: {e}")
            bad += 1
    print(f"mutant_apply: {len(mutants) - bad} of {len(mutants)} mutants anchor exactly once", file=sys.stderr)
    return 1 if bad else 0


def usage():
    print("usage: mutant_apply.py apply|check|files|relocate [--root DIR] [MUTANT...] (--help says more)",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
