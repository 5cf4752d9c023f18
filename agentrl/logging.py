"""What the trainer leader shows: TensorBoard scalars and text samples, and a console progress bar."""

from __future__ import annotations

import sys
import time
from pathlib import Path

# Without a terminal (sbatch, output to a file) the bar's carriage returns would make one line of hundreds of KB:
# a plain line goes out instead, every PLAIN_EVERY_S seconds or every 1/PLAIN_LINES of the run, and at its end.
PLAIN_EVERY_S = 30.0
PLAIN_LINES = 20

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
        self.plain = progress and not sys.stderr.isatty()
        self.bar = tqdm(
            total=total_steps,
            initial=start_step,
            disable=not progress or self.plain,
            desc=desc,
            file=sys.stderr,
            mininterval=1.0,
        )
        self.desc, self.total_steps = desc, total_steps
        self.plain_every = max(1, total_steps // PLAIN_LINES)
        self.plain_last = (start_step, time.monotonic())
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
        if self.plain:
            self._plain_line(step + 1)

    def _plain_line(self, done: int) -> None:
        last_step, last_time = self.plain_last
        now = time.monotonic()
        if done - last_step < self.plain_every and now - last_time < PLAIN_EVERY_S and done < self.total_steps:
            return
        shown = " ".join(f"{label}={value}" for label, value in self.shown.items())
        print(f"{self.desc} step {done}/{self.total_steps} {shown}".rstrip(), file=sys.stderr, flush=True)
        self.plain_last = (done, now)

    def log_scalars(self, step: int, metrics: dict[str, float]) -> None:
        """Scalars at `step` that are not a training step's (evaluation): the progress bar stays put."""
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)

    def note(self, text: str) -> None:
        """A line on the console that does not break the progress bar."""
        self.bar.write(text, file=sys.stdout)
        sys.stdout.flush()

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
