"""What the trainer leader shows: scalars and text samples (TensorBoard, and W&B or MLflow when the config lists
them), and a console progress bar."""

from __future__ import annotations

import sys
import time

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
    """TensorBoard events in `run_dir/tb`, the same scalars and samples to each of `trackers` (W&B, MLflow:
    `agentrl.tracking.open_trackers`), and a progress bar, from `start_step` on.

    A resumed run opens its TensorBoard writer with `purge_step=start_step`: TensorBoard then drops the
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
        trackers: list | None = None,
    ):
        """`postfix`: what the bar shows, {label: (metric name, format)}; RL's reward, success and tokens/s by
        default. `trackers`: more backends, already open; closed with this logger."""
        from tqdm import tqdm

        from agentrl.tracking.tensorboard import TensorBoardTracker

        self.trackers = [TensorBoardTracker(run_dir, start_step), *(trackers or [])]
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
        scalars = {**metrics, "run/restarts": self.restarts}
        for tracker in self.trackers:
            tracker.log_scalars(step, scalars)
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
        for tracker in self.trackers:
            tracker.log_scalars(step, metrics)

    def note(self, text: str) -> None:
        """A line on the console that does not break the progress bar."""
        self.bar.write(text, file=sys.stdout)
        sys.stdout.flush()

    def samples(self, step: int, texts: list[str]) -> None:
        for tracker in self.trackers:
            tracker.log_text(step, "samples", texts)

    def flush(self) -> None:
        """Write every event logged so far to disk."""
        for tracker in self.trackers:
            tracker.flush()

    def close(self) -> None:
        self.bar.close()
        for tracker in self.trackers:
            tracker.close()
