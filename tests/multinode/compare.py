"""Two runs' TensorBoard scalars compared bit for bit, timing ones left out: `python -m tests.multinode.compare A B`."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.mpi.helpers import scalars

TIMING_PREFIXES = ("time/", "perf/")


def differences(run_a: Path, run_b: Path) -> tuple[list[str], list[str]]:
    """(tags compared, descriptions of every tag whose steps or values differ, bit for bit)."""
    a, b = scalars(run_a), scalars(run_b)
    tags = sorted(tag for tag in set(a) | set(b) if not tag.startswith(TIMING_PREFIXES))
    differ = []
    for tag in tags:
        if a.get(tag) != b.get(tag):
            differ.append(f"{tag}: {a.get(tag)} != {b.get(tag)}")
    return tags, differ


def main(argv: list[str]) -> int:
    tags, differ = differences(Path(argv[0]), Path(argv[1]))
    print(f"{len(tags)} non-timing scalars compared, {len(differ)} differ")
    for line in differ:
        print(" ", line)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
