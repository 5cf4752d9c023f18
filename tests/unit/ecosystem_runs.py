"""Real `agentrl train` and `agentrl eval` runs of a tiny from-scratch model on an ecosystem's env, each in its own
process (or under mpirun, with an env rank), and the scalars every adapter's test reads from them."""

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from tests.conftest import mpirun_command
from tests.mpi.helpers import scalars

REPO = Path(__file__).resolve().parents[2]
TINY = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "vocab_size": 128}
ON_AN_ENV_RANK = {"layout.trainer": 1, "layout.rollout": 1, "layout.env": 1}  # mpirun -n 3


def write_config(tmp_path: Path, env_id: str, env_kwargs: dict | None = None, steps: int = 2, **settings) -> Path:
    """config.yaml of a tiny run: the quickstart's, `steps` steps of 2 tasks x 4 episodes on `env_id`, one-token
    turns, no evaluation or checkpoints but the last; `settings`: dotted keys over it (`"rollout.max_turns": 3`)."""
    config = yaml.safe_load((REPO / "launch/configs/quickstart.yaml").read_text())
    config.update(run_dir=str(tmp_path / "run"), steps=steps, eval={"every": 0}, checkpoint={"every": 0})
    config["model"] = {"path": str(tmp_path / "model"), "tiny": dict(TINY)}
    config["env"] = {"id": env_id, "kwargs": env_kwargs or {}}
    config["rollout"].update(tasks_per_step=2, group_size=4, max_turns=1, max_new_tokens=4)
    config["logging"] = {"progress": False}
    for key, value in settings.items():
        *sections, name = key.split(".")
        section = config
        for part in sections:
            section = section.setdefault(part, {})
        section[name] = value
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def agentrl(command: str, config: Path, *args: str, ranks: int = 1, env: dict | None = None, timeout: float = 400):
    """`agentrl COMMAND CONFIG ARGS` in its own process (`ranks` > 1: under mpirun), from the config's folder, with
    `env` added to this process's environment; asserts it exited 0."""
    launcher = [*mpirun_command(ranks)] if ranks > 1 else []
    argv = [*launcher, sys.executable, "-m", "agentrl.cli", command, str(config), *args]
    environment = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    if ranks > 1:  # mpirun's ranks find the tests' modules (and the repository's) on PYTHONPATH
        paths = [entry for entry in (environment.get("PYTHONPATH"), str(REPO)) if entry]
        environment["PYTHONPATH"] = os.pathsep.join(paths)
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=config.parent, env=environment)
    print(result.stdout[-4000:], result.stderr[-4000:])  # shown where a test fails: failed episodes' reasons
    assert result.returncode == 0, (
        f"agentrl {command} exited {result.returncode}\n{result.stdout[-2000:]}\n" + (result.stderr[-4000:])
    )
    return result


def run_dir_of(config: Path) -> Path:
    return Path(yaml.safe_load(config.read_text())["run_dir"])


def train(config: Path, **launch) -> dict[str, list[tuple[int, float]]]:
    """Train `config` (agentrl()'s `ranks`, `env`, `timeout`); its run's scalars, by tag."""
    agentrl("train", config, **launch)
    return scalars(run_dir_of(config))


def evaluate(config: Path, *overrides: str, **launch) -> dict:
    """`agentrl eval` of `config`'s trained run (its newest checkpoint) into config's folder/eval; report.json."""
    out = config.parent / "eval"
    agentrl("eval", config, "--checkpoint", str(run_dir_of(config)), f"--out={out}", *overrides, **launch)
    return json.loads((out / "report.json").read_text())


# evaluation at the end of a 2-step run, in its own process (the Evaluator `agentrl eval` runs): 4 episodes
EVAL_AT_THE_END = {"eval.every": 2, "eval.seeds": [1000000, 4], "eval.n": 1}


def assert_evaluated(logged: dict, step: int, episodes: int) -> None:
    """An evaluation at `step` of `episodes` episodes, none failed."""
    assert logged["eval/episodes"] == [(step, float(episodes))], logged["eval/episodes"]
    assert logged["eval/failed"] == [(step, 0.0)], logged["eval/failed"]


def assert_clean_steps(logged: dict, steps: int, episodes: int) -> None:
    """`steps` steps trained, `episodes` episodes each, none failed."""
    assert [step for step, _ in logged["train/loss"]] == list(range(steps)), logged["train/loss"]
    assert [count for _, count in logged["episode/count"]] == [float(episodes)] * steps, logged["episode/count"]
    assert [failed for _, failed in logged["episode/failed"]] == [0.0] * steps, logged["episode/failed"]
