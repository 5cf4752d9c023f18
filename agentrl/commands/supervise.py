"""`agentrl supervise --max-restarts N -- LAUNCH ...`: run a training launch and relaunch it with resume=true when it
crashes (agentrl/run/supervise.py)."""

from __future__ import annotations

import argparse

from agentrl.run import startup_gc
from agentrl.run.supervise import supervise


def add_arguments(parser) -> None:
    parser.description = "agentrl supervise --max-restarts 3 -- mpirun -n 4 agentrl train CONFIG [key=value ...]"
    parser.add_argument(
        "--max-restarts", type=int, default=3, help="restarts after a crash before giving up (default 3)"
    )
    parser.add_argument("--backoff-s", type=float, default=3.0, help="wait before the first restart; doubles each time")
    parser.add_argument("launch", nargs=argparse.REMAINDER, help="-- then the launch command")


def main(args) -> int:
    startup_gc.settle()  # light, and as long-running as the job it watches
    command = args.launch[1:] if args.launch[:1] == ["--"] else args.launch
    return supervise(command, args.max_restarts, args.backoff_s)
