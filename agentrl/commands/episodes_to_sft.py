"""`agentrl episodes-to-sft RUN_DIR/episodes OUT.jsonl [--min-reward R] [--all]`: dumped RL episodes as SFT
transcripts (agentrl/sft/episodes.py converts them)."""

from __future__ import annotations

from pathlib import Path

from agentrl.sft.episodes import episodes_to_sft

DESCRIPTION = "agentrl episodes-to-sft RUN_DIR/episodes OUT.jsonl [--min-reward R] [--all]"


def add_arguments(parser) -> None:
    parser.description = DESCRIPTION
    parser.add_argument("episodes", help="a run's episodes folder (RUN_DIR/episodes, from rollout.dump_episodes=true)")
    parser.add_argument("out", help="JSONL file to write, for sft.train")
    parser.add_argument("--min-reward", type=float, default=None, help="keep only episodes with at least this reward")
    keep = parser.add_mutually_exclusive_group()
    keep.add_argument(
        "--success-only", dest="success_only", action="store_true", default=True, help="keep successful ones (default)"
    )
    keep.add_argument("--all", dest="success_only", action="store_false", help="keep unsuccessful episodes too")


def main(args) -> int:
    report = episodes_to_sft(args.episodes, args.out, args.success_only, args.min_reward)
    print(report.text(Path(args.out)))
    return 0
