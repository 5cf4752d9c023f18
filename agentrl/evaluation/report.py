"""The leader side of evaluation: every rollout rank's results become `eval/` scalars, a JSON report and a line.

In a training run the trainer leader logs `eval/NAME` at the step evaluated and writes
`run_dir/eval/step_NNNNNN.json` (and with eval.dump_episodes the episodes to
`run_dir/eval/episodes/step_NNNNNN.jsonl`); `agentrl eval` writes the same report as `report.json`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from agentrl import transport
from agentrl.config import EnvConfig, EvalConfig, RolloutConfig
from agentrl.data.episode_dump import write_step
from agentrl.evaluation.metrics import TaskResult, aggregate
from agentrl.transport import Tag

EVAL_DIR = "eval"
REPORT_FILE = "step_{step:06d}.json"
HEADLINE = ("success", "reward_mean", "pass@1", "tool_call_rate", "turns_mean")


def receive_results(layout) -> Callable[[int], list[dict]]:
    """Trainer leader: each rollout rank's eval message (runner.Evaluator.run), in rollout rank order."""

    def results(step: int) -> list[dict]:
        messages = []
        for rank in layout.rollout_ranks:
            message, _ = transport.recv(layout.world, rank, Tag.EVAL)
            if message["step"] != step:
                raise RuntimeError(f"rollout rank {rank} sent eval results of step {message['step']}, expected {step}")
            messages.append(message)
        return messages

    return results


def send_results(layout, step: int, message: dict) -> None:
    """Rollout rank: this rank's eval results to the trainer leader."""
    transport.send(layout.world, {**message, "step": step}, layout.trainer_ranks[0], Tag.EVAL)


def summarize(
    step: int,
    messages: list[dict],
    model: str,
    wall_s: float,
    *,
    eval_config: EvalConfig,
    env: EnvConfig,
    rollout: RolloutConfig,
) -> dict:
    """The report: aggregate metrics, per-task results (in split order), what was evaluated and how (the `eval`
    and `env` sections, the episode limits of `rollout`)."""
    tasks = sorted((task for m in messages for task in m["tasks"]), key=lambda task: task["index"])
    metrics = aggregate([TaskResult(**task) for task in tasks], eval_config.n)
    metrics["time"] = wall_s
    return {
        "step": step,
        "model": model,
        "split": messages[0]["split"],
        "metrics": metrics,
        "eval": eval_config.model_dump(mode="json"),
        "env": env.model_dump(mode="json"),
        "limits": {
            "max_turns": rollout.max_turns,
            "max_new_tokens": rollout.max_new_tokens,
            "max_episode_tokens": rollout.max_episode_tokens,
        },
        "rollout_ranks": len(messages),
        "wall_time_s": wall_s,
        "tasks": tasks,
    }


def write_json(path: Path, report: dict) -> Path:
    """Whole, then renamed: a reader never sees half a report."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=1, ensure_ascii=False))
    os.replace(tmp, path)
    return path


def scalars(report: dict) -> dict[str, float]:
    return {f"eval/{name}": value for name, value in report["metrics"].items()}


def headline(report: dict) -> str:
    metrics = report["metrics"]
    shown = [f"{name} {metrics[name]:.3f}" for name in HEADLINE if name in metrics]
    best_k = max((name for name in metrics if name.startswith("pass@")), key=lambda name: int(name[5:]))
    if best_k != "pass@1":
        shown.append(f"{best_k} {metrics[best_k]:.3f}")
    tasks, n = int(metrics["tasks"]), report["eval"]["n"]
    return f"eval at step {report['step']}: {', '.join(shown)} ({tasks} tasks x {n}, {metrics['time']:.1f} s)"


def table(report: dict) -> str:
    """The metrics as a two-column table."""
    metrics = report["metrics"]
    width = max(map(len, metrics))
    lines = [f"{'metric':<{width}}  value", f"{'-' * width}  -----"]
    lines += [f"{name:<{width}}  {value:.4g}" for name, value in metrics.items()]
    return "\n".join(lines)


def drop_reports_from(run_dir: str | Path, step: int) -> int:
    """A resumed run redoes the evaluations of steps >= `step`: delete their reports and episode dumps."""
    from agentrl.data.episode_dump import drop_dumps_from

    folder = Path(run_dir) / EVAL_DIR
    if not folder.is_dir():
        return 0
    doomed = [p for p in folder.glob("step_*.json") if int(p.stem.removeprefix("step_")) >= step]
    for path in doomed:
        path.unlink()
    return len(doomed) + drop_dumps_from(folder, step)


class RunEvaluation:
    """The trainer leader in a training run: at a step due for evaluation, take the rollout ranks' results
    (`results(step)`), log `eval/` scalars at that step, write the report and the episodes, print a line.

    `run_dir` and `model_path` (`model.path`) are the run's; `eval_config`, `env` and `rollout` are the sections
    the report describes the evaluation with."""

    def __init__(
        self,
        results: Callable[[int], list[dict]],
        logger,
        *,
        run_dir: str,
        model_path: str,
        eval_config: EvalConfig,
        env: EnvConfig,
        rollout: RolloutConfig,
    ):
        self.results, self.logger = results, logger
        self.run_dir, self.model_path = Path(run_dir), model_path
        self.eval_config, self.env, self.rollout = eval_config, env, rollout

    def __call__(self, step: int) -> dict:
        messages = self.results(step)
        wall = max(m["wall_s"] for m in messages)  # the ranks evaluate side by side
        report = summarize(
            step, messages, self.model_path, wall, eval_config=self.eval_config, env=self.env, rollout=self.rollout
        )
        report["weight_version"] = step
        self.logger.log_scalars(step, scalars(report))
        self.logger.flush()  # scalars on disk before the report appears: `agentrl sweep` reads them then
        write_json(self.run_dir / EVAL_DIR / REPORT_FILE.format(step=step), report)
        if self.eval_config.dump_episodes:
            write_step(self.run_dir / EVAL_DIR, step, [r for m in messages for r in m["episodes"]])
        self.logger.note(f"agentrl: {headline(report)}")
        return report
