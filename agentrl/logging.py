"""What the trainer leader shows: TensorBoard scalars and text samples, and a console progress bar."""

from __future__ import annotations

import sys
from pathlib import Path

RL_POSTFIX = {
    "reward": ("episode/reward_mean", ".3f"),
    "success": ("episode/success_rate", ".2f"),
    "tok_s": ("perf/tokens_per_s", ".0f"),
}


class RunLogger:
    """TensorBoard events in `run_dir/tb` and a progress bar, from `start_step` on.

    A resumed run opens its writer with `purge_step=start_step`: TensorBoard then drops the
    points an earlier run logged at or after that step (the ones a crash or a stop made it
    redo), so every step is shown once.
    """

    def __init__(
        self,
        run_dir: str,
        total_steps: int,
        start_step: int,
        progress: bool = True,
        restarts: int = 0,
        postfix: dict[str, tuple[str, str]] | None = None,
        desc: str = "train",
    ):
        """`postfix`: what the bar shows, {label: (metric name, format)}; RL's reward, success and tokens/s by
        default."""
        from torch.utils.tensorboard import SummaryWriter
        from tqdm import tqdm

        self.writer = SummaryWriter(str(Path(run_dir) / "tb"), purge_step=start_step)
        self.bar = tqdm(
            total=total_steps, initial=start_step, disable=not progress, desc=desc, file=sys.stderr, mininterval=1.0
        )
        self.postfix = postfix or RL_POSTFIX
        self.shown: dict[str, str] = {}
        self.restarts = restarts
        self.success_by_step: dict[int, float] = {}

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.writer.add_scalar("run/restarts", self.restarts, step)
        if "episode/success_rate" in metrics:
            self.success_by_step[step] = float(metrics["episode/success_rate"])
        for label, (name, spec) in self.postfix.items():
            if name in metrics:  # a metric logged only some steps (a held-out loss) keeps its last value
                self.shown[label] = format(metrics[name], spec)
        self.bar.set_postfix(self.shown, refresh=False)
        self.bar.update(1)

    def samples(self, step: int, texts: list[str]) -> None:
        body = "\n\n---\n\n".join(f"```\n{text}\n```" for text in texts)
        self.writer.add_text("samples", body, step)

    def flush(self) -> None:
        """Write every event logged so far to disk."""
        self.writer.flush()

    def close(self) -> None:
        self.bar.close()
        self.writer.flush()
        self.writer.close()
