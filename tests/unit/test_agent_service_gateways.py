"""The example agent service serves every gateway of a run, however late each announces itself, and stops when
the run's gateways are gone."""

import json
import subprocess
import sys
import time
from pathlib import Path

SERVICE = Path(__file__).resolve().parents[2] / "examples" / "openai_agent" / "service.py"
UNREACHABLE = {"url": "http://127.0.0.1:9", "service_key": "k"}  # claims fail; the workers wait for the file to go


def test_a_gateway_announced_late_is_served_and_the_service_ends_with_the_run(tmp_path):
    folder = tmp_path / "gateway"
    folder.mkdir()
    (folder / "rollout-0.json").write_text(json.dumps(UNREACHABLE))
    service = subprocess.Popen(
        [sys.executable, str(SERVICE), str(tmp_path), "--concurrency", "2"],
        cwd=SERVICE.parent,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(3)
        (folder / "rollout-1.json").write_text("")  # being written: read on a later look
        time.sleep(1.5)
        (folder / "rollout-1.json").write_text(json.dumps(UNREACHABLE))
        time.sleep(3)
        for path in folder.glob("*.json"):
            path.unlink()
        out, _ = service.communicate(timeout=60)
    finally:
        service.kill()
    assert "gateway rollout-0.json" in out
    assert "gateway rollout-1.json" in out
    assert service.returncode == 0
