"""runtime.keep_freed_memory: a freed tensor's pages serve the next one instead of faulting in fresh ones."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")

# a step's three 4 MiB tensors, made and freed: by glibc's own thresholds the freed heap top (12 MiB) is past its
# trim threshold (twice the largest block freed, 8 MiB), so the pages go back and the next step faults them in again
FAULTS_PER_STEP = """
import resource, sys
import numpy as np
from agentrl.run.freed_memory import keep_freed_memory

print(keep_freed_memory())
def step():
    blocks = [np.ones(1 << 20, dtype=np.float32) for _ in range(3)]
    del blocks
step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    step()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20)
"""


def _run(env_extra: dict[str, str]) -> tuple[bool, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")} | env_extra
    out = subprocess.run(
        [sys.executable, "-c", FAULTS_PER_STEP], env=env, capture_output=True, text=True, timeout=60, check=True
    ).stdout.split()
    return out[0] == "True", float(out[1])


def test_freed_tensors_pages_serve_the_next_step():
    kept, faults = _run({})
    assert kept
    assert faults < 50, faults


def test_thresholds_in_the_environment_are_the_users():
    kept, faults = _run({"MALLOC_TRIM_THRESHOLD_": str(128 << 10)})  # glibc's first trim threshold, fixed
    assert not kept
    assert faults > 500, faults  # a 4 MiB block is 1,024 pages
