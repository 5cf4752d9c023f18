"""Install Debian packages a test needs, when they are missing and this is a root Debian machine."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable


def ensure(packages: tuple[str, ...], present: Callable[[], bool]) -> str | None:
    """apt-get install `packages` unless `present()`; returns why they cannot be had, or None."""
    if present():
        return None
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return f"needs {' '.join(packages)}: not installed and this is not a root Debian/Ubuntu machine"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *packages]):
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
        if result.returncode != 0:
            return f"{' '.join(command)} failed: {result.stderr[-500:]}"
    return None if present() else f"{' '.join(packages)} installed but still not found"
