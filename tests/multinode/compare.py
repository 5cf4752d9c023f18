"""Two runs' TensorBoard scalars compared bit for bit, timing ones left out: `python -m tests.multinode.compare A B`."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.mpi.helpers import scalars

TIMING_PREFIXES = ("time/", "perf/")


def differences(run_a: Path, run_b: Path) -> tuple[list[str], list[str]]:
    """(tags compared, descriptions of every tag whose steps or values differ): bit for bit, but the trainer's
    `train/` values within float rounding (1e-5 relative, 1e-6 absolute), whose last bits move with the torch
    thread count a rank gets (cores over the ranks on its node)."""
    a, b = scalars(run_a), scalars(run_b)
    tags = sorted(tag for tag in set(a) | set(b) if not tag.startswith(TIMING_PREFIXES))
    differ = []
    for tag in tags:
        if not _same(tag, a.get(tag), b.get(tag)):
            differ.append(f"{tag}: {a.get(tag)} != {b.get(tag)}")
    return tags, differ


def _same(tag: str, a, b) -> bool:
    if a == b:
        return True
    if not tag.startswith("train/") or a is None or b is None or [s for s, _ in a] != [s for s, _ in b]:
        return False
    return all(abs(x - y) <= 1e-6 + 1e-5 * abs(y) for (_, x), (_, y) in zip(a, b, strict=True))


def main(argv: list[str]) -> int:
    tags, differ = differences(Path(argv[0]), Path(argv[1]))
    print(f"{len(tags)} non-timing scalars compared, {len(differ)} differ")
    for line in differ:
        print(" ", line)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
