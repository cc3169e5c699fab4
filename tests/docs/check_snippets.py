#!/usr/bin/env python3
"""The code the README and docs/ show is code CI builds and runs: each fenced
block opened as ```cpp PATH:NAME must be, line for line (indentation
removed), the lines between `// [snippet:NAME]` and `// [end]` in PATH, a
program that `meson test` runs. Exit 1 naming each block that is not.

  check_snippets.py SOURCE_ROOT
"""
import pathlib
import re
import sys
import textwrap

FENCE = re.compile(r"^```cpp ([\w./-]+):(\w+)\n(.*?)^```", re.M | re.S)


def snippet(source: pathlib.Path, name: str) -> str:
    text = source.read_text()
    m = re.search(r"^[ \t]*// \[snippet:" + name + r"\]\n(.*?)^[ \t]*// \[end\]", text, re.M | re.S)
    if not m:
        raise KeyError(f"{source} has no // [snippet:{name}] ... // [end]")
    return textwrap.dedent(m.group(1))


def main() -> int:
    root = pathlib.Path(sys.argv[1])
    docs = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    failures, checked = [], 0
    for doc in docs:
        for m in FENCE.finditer(doc.read_text()):
            path, name, block = m.group(1), m.group(2), textwrap.dedent(m.group(3))
            checked += 1
            try:
                expected = snippet(root / path, name)
            except (KeyError, FileNotFoundError) as e:
                failures.append(f"{doc.relative_to(root)}: {e}")
                continue
            if block != expected:
                failures.append(f"{doc.relative_to(root)}: the block from {path}:{name} differs from that file's "
                                f"snippet; copy it again")
    for f in failures:
        print(f, file=sys.stderr)
    print(f"{checked} code blocks checked against the programs they come from, {len(failures)} differ")
    return 1 if failures or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
