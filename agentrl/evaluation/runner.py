"""The rollout side of evaluation: the split's tasks, this rank's share, n episodes each with eval's own seeds.

Evaluation runs between training steps on the engine that rolls out training episodes, and must leave
every random stream of training as it found it: the engine's sampling generator and the process's
global generators are saved and put back around it, each eval episode samples from a seed of its own
(eval.seed, the task, the sample; agent_loop varies it per turn), and its env keys ("eval", step, task,
sample) cannot meet a training episode's (step, index). The seeds depend on neither the number of
rollout ranks nor how requests were batched, so `agentrl eval` of a checkpoint with another layout
gives the same episodes (with the torch engine).
"""

from __future__ import annotations

import random
import sys
import time
from contextlib import contextmanager
from dataclasses import replace

import numpy as np
import torch

from agentrl.config import EvalConfig
from agentrl.data.episode_dump import episode_record
from agentrl.data.tasks import ID_COLUMN, Task
from agentrl.evaluation.metrics import TaskResult
from agentrl.rollout.agent_loop import LoopTimers, gather_episodes
from agentrl.rollout.failures import error_kind
from agentrl.trajectory import Episode

EVAL_STREAM = 2**32 + 11  # keeps eval's seeds apart from the task, engine and shuffle streams


def split_tasks(eval_config: EvalConfig, data_val: str | None) -> tuple[list[Task], str]:
    """Every task of the evaluated split, in order (at most eval.max_tasks), and a line that says what it is;
    `data_val` is `data.val`, the held-out rows."""
    if eval_config.split_of(data_val) == "val":
        from agentrl.data.loading import load_rows

        rows = load_rows(data_val, "data.val")
        count = min(len(rows), eval_config.max_tasks or len(rows))
        has_ids = ID_COLUMN in rows.column_names
        tasks = []
        for index in range(count):
            row = rows[index]
            row_id = row.get(ID_COLUMN) if has_ids else None
            tasks.append(Task(str(index if row_id is None else row_id), env_seed(eval_config.seed, index), row))
        return tasks, f"data.val={data_val} ({count} of {len(rows)} rows)"
    first, count = eval_config.seeds
    count = min(count, eval_config.max_tasks or count)
    return [Task(str(first + i), first + i) for i in range(count)], f"env seeds {first}..{first + count - 1}"


def env_seed(seed: int, index: int) -> int:
    """The env seed of a dataset row's task (every sample of the task gets the same)."""
    return int(np.random.SeedSequence([seed, EVAL_STREAM, index]).generate_state(1)[0])


def sample_seed(seed: int, index: int, sample: int) -> int:
    """The sampling seed of a task's sample-th episode (its first turn; agent_loop derives the others)."""
    return int(np.random.SeedSequence([seed, EVAL_STREAM, index, sample, 1]).generate_state(1)[0])


@contextmanager
def training_streams_kept(engine):
    """Save the engine's sampling stream and the process's global generators; put them back afterwards, and drop
    the KV caches eval's episodes left in the engine (an evaluation always follows a weight update, which drops
    them too, so training's next step finds the engine as it would have without evaluation)."""
    engine_state = engine.rng_state()
    python_state, numpy_state, torch_state = random.getstate(), np.random.get_state(), torch.get_rng_state()
    cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        engine.drop_cached_prefixes()  # the KV caches of eval's episodes, which a training turn could reuse
        if engine_state is not None:
            engine.set_rng_state(engine_state)
        random.setstate(python_state)
        np.random.set_state(numpy_state)
        torch.set_rng_state(torch_state)
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)


class Evaluator:
    """Runs this rollout rank's share of the split (tasks shard, shard + shards, ...) on a RolloutWorker's engine,
    chat format, env client and reward function; `eval_config` is the `eval` section, `data_val` is `data.val`."""

    def __init__(self, worker, shard: int = 0, shards: int = 1, *, eval_config: EvalConfig, data_val: str | None):
        self.eval_config, self.worker = eval_config, worker
        tasks, self.split = split_tasks(eval_config, data_val)
        self.indices = list(range(shard, len(tasks), shards))
        self.tasks = [tasks[i] for i in self.indices]
        self.total_tasks = len(tasks)
        self.sampling = replace(
            worker.sampling, temperature=eval_config.temperature, top_p=eval_config.top_p, top_k=eval_config.top_k
        )
        self.errors_seen: set[str] = set()

    def run(self, step: int, dump: bool = False) -> dict:
        """This rank's results at `step`: {"tasks": [TaskResult dict], "episodes": [dump records], "wall_s"}."""
        started = time.perf_counter()
        n, seed = self.eval_config.n, self.eval_config.seed
        episodes, runs = [], []
        for index, task in zip(self.indices, self.tasks, strict=True):
            for sample in range(n):
                episode = Episode(
                    group=index,
                    task_seed=task.seed,
                    task_id=task.id,
                    task_options=task.options,
                    data_source=(task.options or {}).get("data_source"),
                )
                greedy = self.sampling.temperature == 0
                sampling = self.sampling if greedy else replace(self.sampling, seed=sample_seed(seed, index, sample))
                episodes.append(episode)
                runs.append(self._episode(episode, sampling, ("eval", step, index, sample)))
        with training_streams_kept(self.worker.engine):
            self.worker.loop.run_until_complete(gather_episodes(runs))
        self._report_errors(step, episodes)
        results = [
            self._task_result(index, task, episodes[i * n : (i + 1) * n])
            for i, (index, task) in enumerate(zip(self.indices, self.tasks, strict=True))
        ]
        records = [episode_record(e, step, trained=False) for e in episodes] if dump else []
        return {"tasks": results, "episodes": records, "wall_s": time.perf_counter() - started, "split": self.split}

    def _episode(self, episode: Episode, sampling, key):
        return self.worker.episode(episode, sampling, key, LoopTimers())

    @staticmethod
    def _task_result(index: int, task: Task, episodes: list[Episode]) -> dict:
        return TaskResult(
            index=index,
            task_id=task.id,
            data_source=episodes[0].data_source,
            rewards=[float(e.reward) for e in episodes],
            successes=[bool(e.success) for e in episodes],
            turns=[int(e.turns) for e in episodes],
            tokens=[len(e.tokens) for e in episodes],
            response_tokens=[int(sum(e.loss_mask)) for e in episodes],
            tool_calls=[float(e.metrics.get("tool_calls", 0.0)) for e in episodes],
            reasoning_tokens=[float(e.metrics.get("reasoning_tokens", 0.0)) for e in episodes],
            finish=[e.finish for e in episodes],
            tool_env=any(bool(e.tools) or "tool_calls" in e.metrics for e in episodes),
        ).as_dict()

    def _report_errors(self, step: int, episodes: list[Episode]) -> None:
        """Each new kind of failure once, in full (with the row, for a dataset split)."""
        failed = [e for e in episodes if e.error]
        for episode in failed:
            headline = error_kind(episode.error)
            if headline in self.errors_seen:
                continue
            self.errors_seen.add(headline)
            count = sum(error_kind(e.error) == headline for e in failed)
            where = f"{self.split} task {episode.task_id}"
            print(
                f"agentrl: eval at step {step}: {count} episode(s) failed (counted in eval/failed; later repeats are "
                f"only counted); {where}:\n{episode.error}",
                file=sys.stderr,
                flush=True,
            )
