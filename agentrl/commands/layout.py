"""`agentrl layout CONFIG --np N [--ranks-per-node R] [--gpus-per-node G] [--hosts ...] [--eval]`: print which rank
does what, without training (agentrl/run/plan.py)."""

from __future__ import annotations

from agentrl.config import load_config
from agentrl.layout import simulated_ranks_per_node
from agentrl.run.plan import JobShape, config_plan, format_plan, parse_hosts


def add_arguments(parser) -> None:
    parser.add_argument("config")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--np", type=int, required=True, help="world size (ranks in the job)")
    parser.add_argument(
        "--ranks-per-node",
        type=int,
        default=None,
        help="ranks per node (default: $AGENTRL_RANKS_PER_NODE, else all on one node)",
    )
    parser.add_argument("--gpus-per-node", type=int, default=0, help="GPUs per node (0: CPU)")
    parser.add_argument(
        "--hosts",
        default=None,
        help="each rank's host as MPICH's -hosts writes it, node0:2,node1:2 (nodes numbered by host, shown by name)",
    )
    parser.add_argument("--eval", action="store_true", help="the plan of `agentrl eval` (trainer ranks report or idle)")


def main(args) -> int:
    config = load_config(args.config, args.overrides)
    hosts = parse_hosts(args.hosts) if args.hosts else None
    ranks_per_node = args.ranks_per_node or simulated_ranks_per_node()
    job = JobShape(args.np, ranks_per_node, args.gpus_per_node, hosts=hosts)
    # the weight transport is resolved from the planned placements, as a run resolves it
    print(format_plan(config_plan(config, job), single_process=args.np == 1, evaluating=args.eval))
    if args.np == 1:
        print("world size 1: every role runs in this one process")
    return 0
