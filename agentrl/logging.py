"""What the trainer leader shows: TensorBoard scalars and text samples, and a console progress bar."""

from __future__ import annotations

import sys
from pathlib import Path


class RunLogger:
    def __init__(self, run_dir: str, total_steps: int, start_step: int, progress: bool = True):
        from torch.utils.tensorboard import SummaryWriter
        from tqdm import tqdm

        self.writer = SummaryWriter(str(Path(run_dir) / "tb"))
        self.bar = tqdm(
            total=total_steps, initial=start_step, disable=not progress, desc="train", file=sys.stderr, mininterval=1.0
        )

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.bar.set_postfix(
            reward=f"{metrics.get('episode/reward_mean', 0):.3f}",
            success=f"{metrics.get('episode/success_rate', 0):.2f}",
            tok_s=f"{metrics.get('perf/tokens_per_s', 0):.0f}",
            refresh=False,
        )
        self.bar.update(1)

    def samples(self, step: int, texts: list[str]) -> None:
        body = "\n\n---\n\n".join(f"```\n{text}\n```" for text in texts)
        self.writer.add_text("samples", body, step)

    def close(self) -> None:
        self.bar.close()
        self.writer.flush()
        self.writer.close()
