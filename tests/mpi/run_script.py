"""`python run_script.py SCRIPT ARGS...`: run a test script as the `agentrl` command runs a rank, with the garbage
collector's start-up thresholds raised before torch and transformers are imported (agentrl/run/startup_gc.py)."""

import os
import sys

from agentrl.run import startup_gc
from tests.mpi.forkserver import run_as_main

startup_gc.defer_collection()
run_as_main(sys.argv[1:], os.getcwd())  # as `python SCRIPT ARGS...` would
