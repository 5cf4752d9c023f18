"""What rank 0 prints when a run ends: how far it got, how well, where its files are, what to run next."""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass
from pathlib import Path

from agentrl.run.preempt import stopped_message
from agentrl.tracking import summary_lines


def format_duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, seconds = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


def success_trend(success_by_step: dict[int, float]) -> str | None:
    """'0.05 (steps 0-9) -> 0.80 (steps 90-99)': the mean over the first and the last tenth of the logged steps."""
    steps = sorted(success_by_step)
    if not steps:
        return None
    window = max(1, math.ceil(len(steps) / 10))

    def mean_over(chosen: list[int]) -> str:
        mean = sum(success_by_step[step] for step in chosen) / len(chosen)
        span = f"step {chosen[0]}" if len(chosen) == 1 else f"steps {chosen[0]}-{chosen[-1]}"
        return f"{mean:.2f} ({span})"

    return f"{mean_over(steps[:window])} -> {mean_over(steps[-window:])}"


def resume_command(command: list[str] | None, world_size: int) -> str:
    """The command that started this run with resume=true instead of any resume=... it had."""
    if not command:
        return "the same command with resume=true"
    kept = [part for part in command if not part.startswith("resume=")]
    launcher = ["mpirun", "-n", str(world_size)] if world_size > 1 else []
    return shlex.join([*launcher, *kept, "resume=true"])


@dataclass
class RunSummary:
    config: object
    world_size: int
    start_step: int
    done: int
    wall_s: float
    command: list[str] | None = None

    def text(self, success_by_step: dict[int, float], stop_reason: str) -> str:
        steps = self.config.steps
        run_dir = Path(self.config.run_dir)
        resumed = f", resumed at step {self.start_step}" if self.start_step else ""
        took = f"{self.done}/{steps} steps in {format_duration(self.wall_s)}{resumed}"
        finished = self.done >= steps
        if finished:
            lines = [f"agentrl: finished: {took}"]
        else:
            lines = [f"{stopped_message(self.done)} ({stop_reason}): {took}"]
        trend = success_trend(success_by_step)
        if trend:
            lines.append(f"  success rate  {trend}")
        from agentrl.trainer import checkpoint  # torch: only rank 0, a trainer, prints the summary

        saved = checkpoint.step_path(run_dir, self.done)
        if saved.is_dir():
            lines.append(f"  checkpoint    {saved}")
        for name in self.config.policies:  # several policies: each has a run folder of its own
            saved = checkpoint.step_path(run_dir / "policies" / name, self.done)
            if saved.is_dir():
                lines.append(f"  checkpoint    {saved}")
        logs = run_dir / "policies" if self.config.policies else run_dir / "tb"
        lines.append(f"  tensorboard   tensorboard --logdir {logs}")
        lines += summary_lines(run_dir, self.config.logging.backends)
        if not finished:
            lines.append(f"  continue      {resume_command(self.command, self.world_size)}")
        return "\n".join(lines)
