"""The SHA-256 of every module of ``mbn_core`` and ``service``, to tell whether an image holds
a tree's code (docker/check-image.sh).

    python code_digest.py               # in the image: "<path> <sha256>" per module installed
    python code_digest.py --check ROOT  # here: read those lines, compare with ROOT's files
"""

import hashlib
import importlib
import pathlib
import sys

PACKAGES = ("mbn_core", "service")


def installed() -> None:
    for name in PACKAGES:
        root = pathlib.Path(importlib.import_module(name).__file__).parent
        for path in sorted(root.rglob("*.py")):
            relative = path.relative_to(root.parent).as_posix()
            sys.stdout.write(f"{relative} {hashlib.sha256(path.read_bytes()).hexdigest()}\n")


def check(tree: pathlib.Path) -> int:
    lines = [line.split() for line in sys.stdin.read().splitlines() if line.strip()]
    differ = [
        path
        for path, digest in lines
        if not (tree / path).is_file()
        or hashlib.sha256((tree / path).read_bytes()).hexdigest() != digest
    ]
    for path in differ[:10]:
        sys.stderr.write(f"differs from the tree: {path}\n")
    if len(lines) < 50:
        sys.stderr.write(f"only {len(lines)} modules in the image\n")
        return 1
    return 1 if differ else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--check"]:
        sys.exit(check(pathlib.Path(sys.argv[2])))
    installed()
