"""`python run_script.py SCRIPT ARGS...`: run a test script as the `agentrl` command runs a rank, with the garbage
collector's start-up thresholds raised before torch and transformers are imported (agentrl/startup.py)."""

import runpy
import sys
from pathlib import Path

from agentrl import startup

startup.defer_collection()
script = sys.argv[1]
sys.argv = sys.argv[1:]
sys.path[0] = str(Path(script).parent)  # what `python SCRIPT` puts first
runpy.run_path(script, run_name="__main__")
