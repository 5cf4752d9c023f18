"""agentrl beside TRL's GRPOTrainer: one model, task, reward, batch and step count, on this machine (issue 53).

    python benchmarks/vs_trl.py                                  # both tasks, seeds 0 1 2, 30 steps, every side
    python benchmarks/vs_trl.py --tasks digit --seeds 0 --sides trl agentrl-1 --steps 20
    python benchmarks/vs_trl.py --report benchmarks/results/vs-trl.md     # also append the tables to that file
    python benchmarks/vs_trl.py --shape qwen0.5b --trl-python python3 --sides trl agentrl-1 --seeds 0   # on a GPU

`--shape qwen0.5b` trains a model of Qwen2.5-0.5B's width, depth and heads (0.29B parameters, random weights, the
tasks' own small tokenizer: no download) at lr 5e-5 on both sides; where CUDA is available both sides train on the
GPU (TRL's default device, agentrl's layout binds it), in float32 as on CPU. `--trl-python` runs TRL's side with an
interpreter where trl already imports (a machine without network: install trl's and accelerate's wheels there),
instead of making `--trl-venv` with pip.

Tasks (both GRPO, 8 prompts x 8 completions a step, lr 5e-3, no KL, float32, the quickstart's tiny model shape
(`--shape`)):
- `digit`: one turn; the prompt names a digit, the reply is graded by `benchmarks.tasks.digit` (1 for that digit,
  0.1 for another digit); 2 new tokens. Success: the named digit.
- `guess`: the quickstart's guess-the-number game (1..7, 4 guesses, one token a turn), the env's reward.
  Success: the number found. TRL plays it through `rollout_func` (benchmarks/vs_trl_side.py says why).

Sides (`--sides`; the default ones are marked *): `trl`* and `trl-1t`* (GRPOTrainer, one process, 2 and 1 torch
threads: on a machine others load, 2 threads can be several times slower than 1; `x TRL` divides by the fastest TRL
side of the run, seed by seed); `trl-k`* and `trl-1tk`*: the same with glibc's malloc keeping freed memory through
the environment, as agentrl's ranks do by default (`runtime.keep_freed_memory`); TRL runs in its own venv
(`--trl-venv`, made here on first use with the torch and transformers versions of this venv); and `agentrl train`:
- `agentrl-1`*: one process, the config as it is (2 torch threads); `agentrl-1t`*: the same, runtime.torch_threads=1;
  `agentrl-1c`*: one process, `rollout.engine.scheduler=continuous`; `agentrl-1tc`: that with 1 torch thread
  (`agentrl-1tcp`* with `trainer.shared_prefix`: the fastest one process);
- `agentrl-4`*: `mpirun -n 4`, 1 trainer, 2 rollout, 1 env (the quickstart's ranks); `agentrl-4c`: the same, continuous;
- `agentrl-2`: `mpirun -n 2`, 1 trainer, 1 rollout with its envs in-process; `agentrl-2t`: the same, 2 torch threads
  a rank; `agentrl-2a`: the same, `rollout.max_staleness=1` (step n+1 generated while step n trains: one step
  off-policy); `agentrl-2ac`*: `2a` with the continuous scheduler; `agentrl-2at`: `2a` with
  `algorithm.correction.mode=tis`; `agentrl-3a`: 1 trainer, 2 rollout, staleness 1;
- `agentrl-4d`: `mpirun -n 4`, 2 trainer ranks (data parallel) and 2 rollout ranks with their envs in-process, in
  lockstep, so that each phase has both cores; `agentrl-4dc`: the same, continuous scheduler;
- `agentrl-2h`: `mpirun -n 2`, `layout.hybrid=true`: each rank generates half of the step's tasks, then both train
  on the step's episodes, data parallel (on-policy); `agentrl-2hc`: the same, continuous scheduler;
  `agentrl-2hcp`*: that with `trainer.shared_prefix`;
- any of those with a `p` after it (`agentrl-1tp`, `agentrl-2acp`): the same with `trainer.shared_prefix=true` (a
  group's prompt forwarded once in training); and any with an `n` after that (`agentrl-1tcpn`, `agentrl-2hcpn`):
  with `runtime.env_step_timeout_s=null`, env calls (here the reward function) on the rank's own thread without a
  time limit, as TRL calls its reward functions (the default runs them in a worker thread under a deadline, at a
  hand-over each way per batch of calls);
- with `--baseline PATH` (another agentrl checkout, e.g. a `git worktree` of main before a change): every agentrl
  side again as `SIDE@base`, run with PATH's agentrl, right after the same side of this checkout in each seed, so a
  change and the code before it share the machine's load (`x base` in the table: the side's samples/s over its
  baseline's, the median of the seeds' ratios).

Both sides load the same model folder (built by agentrl from `model.tiny`, saved with save_pretrained). A warm-up
run of each side per task (2 steps, not counted) builds it and fills the disk cache. Then the runs interleave
(seed 0: every task and side, then seed 1, ...) so the machine's load falls on all of them alike. Per run:
- s/step: the median interval between two steps' ends, over the steps after `--warmup`;
- CPU s/step: the CPU seconds (user + system) of all the run's processes between the end of step `--warmup` and the
  last step's end, per step (sampled every 0.1 s, interpolated): what the work costs, which the machine's other
  load moves less than wall time (a thread waiting for a core spends no CPU; one spinning for its partner does);
- samples/s: episodes (completions) per second at that median; tokens/s: the trained sequences' tokens (prompt,
  completion, env replies), and the sampled tokens alone;
- peak memory: RSS summed over the run's processes (sampled every 0.2 s), and PSS (shared pages split);
- start-up: seconds from launch to the first step's end, less that step;
- the learning curve: mean reward and success per window of steps.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agentrl.run import freed_memory  # noqa: E402
from benchmarks.tasks import digit  # noqa: E402

TWO = ["layout.trainer=1", "layout.rollout=1", "layout.env=0"]
TWO_AND_TWO = ["layout.trainer=2", "layout.rollout=2", "layout.env=0"]
HYBRID = [*TWO_AND_TWO, "layout.hybrid=true"]
AGENTRL = {  # side -> (ranks, config overrides); one rank: every role in one process
    "agentrl-1": (1, []),
    "agentrl-1t": (1, ["runtime.torch_threads=1"]),
    # the continuous scheduler keeps an episode's KV cache between its turns
    "agentrl-1c": (1, ["rollout.engine.scheduler=continuous"]),
    "agentrl-1tc": (1, ["runtime.torch_threads=1", "rollout.engine.scheduler=continuous"]),
    "agentrl-4": (4, ["layout.trainer=1", "layout.rollout=2", "layout.env=1"]),
    "agentrl-2": (2, ["layout.trainer=1", "layout.rollout=1", "layout.env=0"]),
    # lockstep ranks take turns, so each might use both cores' threads
    "agentrl-2t": (2, ["layout.trainer=1", "layout.rollout=1", "layout.env=0", "runtime.torch_threads=2"]),
    # step n+1 generated while step n trains (one step off-policy)
    "agentrl-2a": (2, ["layout.trainer=1", "layout.rollout=1", "layout.env=0", "rollout.max_staleness=1"]),
    "agentrl-2ac": (2, [*TWO, "rollout.max_staleness=1", "rollout.engine.scheduler=continuous"]),
    # ... with the older weights' episodes weighted by min(pi_old / mu, 2) instead of clipped against mu
    "agentrl-2at": (2, [*TWO, "rollout.max_staleness=1", "algorithm.correction.mode=tis"]),
    "agentrl-4c": (4, ["layout.trainer=1", "layout.rollout=2", "layout.env=1", "rollout.engine.scheduler=continuous"]),
    "agentrl-3a": (3, ["layout.trainer=1", "layout.rollout=2", "layout.env=0", "rollout.max_staleness=1"]),
    # two trainer ranks (data parallel) and two rollout ranks taking turns: each phase on both cores
    "agentrl-4d": (4, TWO_AND_TWO),
    "agentrl-4dc": (4, [*TWO_AND_TWO, "rollout.engine.scheduler=continuous"]),
    # two hybrid ranks, each generating half the step's tasks, then training on them (data parallel)
    "agentrl-2h": (2, HYBRID),
    "agentrl-2hc": (2, [*HYBRID, "rollout.engine.scheduler=continuous"]),
}
SHARED_PREFIX = "trainer.shared_prefix=true"  # a group's prompt forwarded once in training
AGENTRL |= {f"{side}p": (ranks, [*overrides, SHARED_PREFIX]) for side, (ranks, overrides) in list(AGENTRL.items())}
# env calls on the rank's own thread, without a time limit (a hung reward function hangs the rank), as TRL calls
# its reward functions
INLINE_ENVS = "runtime.env_step_timeout_s=null"
AGENTRL |= {f"{side}n": (ranks, [*overrides, INLINE_ENVS]) for side, (ranks, overrides) in list(AGENTRL.items())}
# side -> torch threads; "k": glibc's heap keeps freed memory, as agentrl's ranks' does by default
TRL = {"trl": 2, "trl-1t": 1, "trl-k": 2, "trl-1tk": 1}
BASE = "@base"  # an agentrl side run with --baseline's checkout
SIDES = (*TRL, *AGENTRL)
DEFAULT_SIDES = (
    "trl",
    "trl-1t",
    "trl-k",
    "trl-1tk",
    "agentrl-1",
    "agentrl-1t",
    "agentrl-1c",
    "agentrl-1tcp",
    "agentrl-4",
    "agentrl-2ac",
    "agentrl-2hcp",
)
TINY = {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 128, "init_std": 0.1}  # the quickstart's
SHAPES = {  # --shape -> (model.tiny, learning rate of both sides)
    "tiny": (TINY, 5e-3),
    # Qwen2.5-0.5B's width, depth and heads (MLP 4x wide, KV heads half the heads): 0.29B parameters, tokenizer
    # trained on the tasks' texts as for the tiny one; for a GPU
    "qwen0.5b": ({"hidden_size": 896, "num_layers": 24, "num_heads": 14, "vocab_size": 128, "init_std": 0.02}, 5e-5),
}
GAME = {"low": 1, "high": 7, "max_guesses": 4, "progress_reward": 0.5, "name_the_last": True}  # the quickstart's
TASKS = {  # task -> rollout settings both sides share
    "digit": {"max_turns": 1, "max_new_tokens": 2, "max_episode_tokens": 64},
    "guess": {"max_turns": 4, "max_new_tokens": 1, "max_episode_tokens": 256},
}
PROMPTS, GROUP = 8, 8
TRL_VERSION = "1.16.0"


def agentrl_config(task: str, out: Path, shape: str) -> Path:
    """The task's agentrl config (YAML, which JSON is), written under `out`."""
    tiny, lr = SHAPES[shape]
    rollout = {"tasks_per_step": PROMPTS, "group_size": GROUP, **TASKS[task]}
    config = {
        "run_dir": str(out / "runs" / task),
        "steps": 30,
        "seed": 0,
        "layout": {"trainer": 1, "rollout": 1, "env": 0},
        "model": {"path": str(out / f"model-{task}"), "tiny": tiny},
        "rollout": rollout,
        "trainer": {"micro_batch_size": PROMPTS * GROUP},
        "algorithm": {"name": "grpo"},
        "optimizer": {"lr": lr},
        "checkpoint": {"every": 0},
        "logging": {"sample_every": 0, "progress": False},
    }
    if task == "digit":
        config["data"] = {"train": str(out / "digit.jsonl")}
        config["env"] = {"id": "qa", "kwargs": {"reward_fn": "benchmarks.tasks.digit:digit_score", "max_steps": 1}}
    else:
        config["env"] = {"id": "guess_number", "kwargs": GAME}
    path = out / f"{task}.yaml"
    path.write_text(json.dumps(config, indent=1) + "\n")
    return path


def trl_python(venv: Path) -> Path:
    """The TRL venv's python, made on first use: trl, accelerate and gymnasium, pinned to this venv's torch and
    transformers (an unpinned torch pulls the multi-GB CUDA build)."""
    import torch
    import transformers

    pins = [f"torch=={torch.__version__.split('+')[0]}", f"transformers=={transformers.__version__}",
            f"trl=={TRL_VERSION}", "accelerate", "gymnasium"]  # fmt: skip
    python, ready = venv / "bin" / "python", venv / ".vs_trl_pins"
    if ready.is_file() and ready.read_text().split() == pins:
        return python
    print(f"vs_trl: making {venv} ({' '.join(pins)}; a few minutes)", flush=True)
    if not python.is_file():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *pins], check=True)
    ready.write_text(" ".join(pins) + "\n")
    return python


def gpu_memory_mib(pids: set[int], smi_csv: str) -> float:
    """GPU memory the processes `pids` hold, from `nvidia-smi --query-compute-apps=pid,used_memory
    --format=csv,noheader,nounits` (a line per process and GPU)."""
    used = 0.0
    for line in smi_csv.splitlines():
        pid, _, mib = line.partition(",")
        if pid.strip().isdigit() and int(pid) in pids:
            used += float(mib)
    return used


NVIDIA_SMI = shutil.which("nvidia-smi")
SMI_QUERY = ["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]


class Watch:
    """Peak RSS (and PSS) summed over a process and its descendants, their CPU seconds over time and, where
    nvidia-smi runs, their peak GPU memory, sampled on a thread."""

    def __init__(self, pid: int, every_s: float = 0.1):
        self.root = psutil.Process(pid)
        self.rss = self.pss = 0
        self.gpu = 0.0
        self.cpu: list[tuple[float, float]] = []  # (time, CPU seconds of the live processes)
        self.every_s = every_s
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _tree(self) -> list[psutil.Process]:
        try:
            return [self.root, *self.root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def _watch(self) -> None:
        tick = 0
        while not self.stopped.wait(self.every_s):
            rss = pss = 0
            cpu = 0.0
            for process in self._tree():
                try:
                    rss += process.memory_info().rss
                    times = process.cpu_times()
                    cpu += times.user + times.system
                    if tick % 10 == 0:
                        pss += process.memory_full_info().pss
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
            self.rss = max(self.rss, rss)
            self.pss = max(self.pss, pss)
            if NVIDIA_SMI and tick % 5 == 0:
                self.gpu = max(self.gpu, self._gpu())
            self.cpu.append((time.time(), cpu))
            tick += 1

    def _gpu(self) -> float:
        pids = {process.pid for process in self._tree()}
        try:
            listed = subprocess.run([NVIDIA_SMI, *SMI_QUERY], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            return 0.0
        return gpu_memory_mib(pids, listed)

    def stop(self) -> dict:
        self.stopped.set()
        self.thread.join()
        return {"rss": self.rss / 2**20, "pss": self.pss / 2**20, "gpu": self.gpu, "cpu": self.cpu}


def launch(command: list[str], env: dict, log: Path) -> dict:
    """Run `command` from the repository root, its output in `log`; its wall seconds, peak RSS and PSS (MiB), and
    CPU samples."""
    started = time.time()
    with log.open("wb") as sink:
        process = subprocess.Popen(command, cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT)
        watch = Watch(process.pid)
        code = process.wait()
    watched = watch.stop()
    if code:
        raise SystemExit(f"vs_trl: {' '.join(command[:6])} ... failed (exit {code}); see {log}")
    return {"wall": time.time() - started, **watched}


def run_trl(python: Path, side: str, task: str, seed: int, steps: int, out: Path, name: str, lr: float) -> dict:
    threads = TRL[side]
    result = out / "results" / f"{name}.json"
    command = [
        str(python), "benchmarks/vs_trl_side.py", "--task", task, "--model", str(out / f"model-{task}"),
        "--lr", str(lr), "--steps", str(steps), "--seed", str(seed), "--threads", str(threads),
        "--work", str(out / "trl-work"), "--out", str(result), "--max-turns", str(TASKS[task]["max_turns"]),
        "--max-new-tokens", str(TASKS[task]["max_new_tokens"]),
    ]  # fmt: skip
    command += ["--rows", str(out / "digit.jsonl")] if task == "digit" else ["--game", json.dumps(GAME)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false"}
    if side.endswith("k"):  # the thresholds runtime.keep_freed_memory sets in agentrl's ranks, through the environment
        env |= {
            "MALLOC_MMAP_THRESHOLD_": str(freed_memory.MMAP_THRESHOLD),
            "MALLOC_TRIM_THRESHOLD_": str(freed_memory.TRIM_THRESHOLD),
        }
    watched = launch(command, env, out / "logs" / f"{name}.log")
    data = json.loads(result.read_text())
    steps_out = [
        {"end": s["end"], "reward": _mean(s["rewards"]), "success": _mean(s["success"]), "episodes": len(s["rewards"]),
         "tokens": s["tokens"], "sampled_tokens": s["sampled_tokens"]}
        for s in data["steps"]
    ]  # fmt: skip
    return {"started": data["started"], **watched, "steps": steps_out}


def run_agentrl(side: str, config: Path, seed: int, steps: int, out: Path, name: str, repo: Path = REPO) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    run_dir = out / "runs" / name
    shutil.rmtree(run_dir, ignore_errors=True)
    binary = Path(sys.executable).parent
    command = [str(binary / "agentrl"), "train", str(config), f"steps={steps}", f"seed={seed}", f"run_dir={run_dir}"]
    ranks, overrides = AGENTRL[side]
    command += overrides
    if ranks > 1:
        command = [str(binary / "mpirun"), "-n", str(ranks), *command]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(repo)}
    started = time.time()
    watched = launch(command, env, out / "logs" / f"{name}.log")
    events = EventAccumulator(str(run_dir / "tb"), size_guidance={SCALARS: 0})
    events.Reload()

    def by_step(tag: str) -> dict[int, tuple[float, float]]:
        return {e.step: (e.wall_time, e.value) for e in events.Scalars(tag)}

    ends, rewards, successes = by_step("time/step"), by_step("episode/reward_mean"), by_step("episode/success_rate")
    counts, tokens, sampled = (
        by_step("episode/count"),
        by_step("episode/tokens_mean"),
        by_step("episode/response_tokens_mean"),
    )
    steps_out = [
        {"end": ends[s][0], "reward": rewards[s][1], "success": successes[s][1], "episodes": int(counts[s][1]),
         "tokens": tokens[s][1] * counts[s][1], "sampled_tokens": sampled[s][1] * counts[s][1]}
        for s in sorted(ends)
    ]  # fmt: skip
    return {"started": started, **watched, "steps": steps_out}


def _mean(values) -> float:
    return sum(values) / len(values) if values else 0.0


def cpu_at(samples: list[tuple[float, float]], moment: float) -> float:
    """The CPU seconds at `moment`, linear between the samples around it."""
    for (t0, c0), (t1, c1) in itertools.pairwise(samples):
        if t0 <= moment <= t1:
            return c0 + (c1 - c0) * (moment - t0) / (t1 - t0) if t1 > t0 else c1
    raise ValueError(f"no CPU sample around {moment}: the run was shorter than the watch's period")


def summary(run: dict, warmup: int) -> dict:
    """The run's figures: median step interval after `warmup` steps and what follows from it."""
    steps = run["steps"]
    ends = [s["end"] for s in steps]
    intervals = [b - a for a, b in itertools.pairwise(ends)][max(0, warmup - 1) :]
    step_s = statistics.median(intervals)
    later = steps[warmup:]
    episodes = _mean([s["episodes"] for s in later])
    first = ends[warmup - 1] if warmup else ends[0]
    return {
        "step_s": step_s,
        "cpu_s": (cpu_at(run["cpu"], ends[-1]) - cpu_at(run["cpu"], first)) / len(intervals),
        "samples_s": episodes / step_s,
        "tokens_s": _mean([s["tokens"] for s in later]) / step_s,
        "sampled_s": _mean([s["sampled_tokens"] for s in later]) / step_s,
        "rss": run["rss"],
        "pss": run["pss"],
        "gpu": run.get("gpu", 0.0),
        "startup": ends[0] - run["started"] - (intervals[0] if intervals else 0.0),
        "wall": run["wall"],
    }


def curve(run: dict, window: int) -> list[tuple[float, float]]:
    steps = run["steps"]
    return [
        (_mean([s["reward"] for s in steps[i : i + window]]), _mean([s["success"] for s in steps[i : i + window]]))
        for i in range(0, len(steps), window)
    ]


def check_same_tokens(task: str, out: Path) -> None:
    """TRL's side renders the prompt and the env's replies to the token ids agentrl's chat format does."""
    from transformers import AutoTokenizer

    from agentrl.models.chat_format import ChatFormat
    from benchmarks import vs_trl_side

    tokenizer = AutoTokenizer.from_pretrained(out / f"model-{task}")
    chat = ChatFormat(tokenizer)
    if task == "digit":
        texts, replies = [row["prompt"] for row in digit.rows(20)], []
    else:
        from envs.guess_number.env import GuessNumberEnv

        env, draw, replies = GuessNumberEnv(**GAME), random.Random(0), set()
        texts = [env.reset(seed=0)[0]]
        for seed in range(200):  # random games: every reply the game gives in 1..7
            env.reset(seed=seed)
            done = False
            while not done:
                reply, _, terminated, truncated, _ = env.step(draw.choice([*"1234567", "x"]))
                replies.add(reply)
                done = terminated or truncated
    for text in texts:
        if vs_trl_side.prompt_ids(tokenizer, text) != chat.prompt_ids(text):
            raise SystemExit(f"vs_trl: the two sides tokenize the prompt {text!r} differently")
    for reply in replies:
        if vs_trl_side.observation_ids(tokenizer, reply) != chat.observation_ids(reply):
            raise SystemExit(f"vs_trl: the two sides tokenize the env's reply {reply!r} differently")


def table(rows: list[dict], tasks: list[str], sides: list[str]) -> str:
    """Medians over seeds per task and side. `x TRL`: the median over seeds of samples/s over the fastest TRL side's
    in that seed; `x TRL by CPU`: the TRL side's least CPU seconds a step over this side's (every
    side trains 64 episodes a step), which the machine's other load moves less than wall time."""
    gpu = any(r["summary"]["gpu"] for r in rows)  # a column only where a run held GPU memory
    based = any(side.endswith(BASE) for side in sides)  # a column only with --baseline
    columns = ["task", "side", "s/step", "samples/s", "x TRL", *(["x base"] if based else []), "CPU s/step"]
    columns += ["x TRL by CPU", "tokens/s", "sampled tok/s", "peak RSS MiB", "peak PSS MiB"]
    columns += [*(["peak GPU MiB"] if gpu else []), "start-up s"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for task in tasks:
        trl: dict[int, float] = {}  # seed -> the fastest TRL side's samples/s
        trl_cpu: dict[int, float] = {}  # seed -> the TRL side's least CPU seconds a step
        for r in rows:
            if r["task"] == task and r["side"] in TRL:
                trl[r["seed"]] = max(trl.get(r["seed"], 0.0), r["summary"]["samples_s"])
                trl_cpu[r["seed"]] = min(trl_cpu.get(r["seed"], float("inf")), r["summary"]["cpu_s"])
        for side in sides:
            found = [r for r in rows if r["task"] == task and r["side"] == side]
            if not found:
                continue
            med = {key: statistics.median(r["summary"][key] for r in found) for key in found[0]["summary"]}
            ratios = [r["summary"]["samples_s"] / trl[r["seed"]] for r in found if r["seed"] in trl]
            by_cpu = [trl_cpu[r["seed"]] / r["summary"]["cpu_s"] for r in found if r["seed"] in trl_cpu]
            ratio = f"{statistics.median(ratios):.2f}" if ratios else "-"
            cpu_ratio = f"{statistics.median(by_cpu):.2f}" if by_cpu else "-"
            base = {r["seed"]: r["summary"]["samples_s"] for r in rows if (r["task"], r["side"]) == (task, side + BASE)}
            over_base = [r["summary"]["samples_s"] / base[r["seed"]] for r in found if r["seed"] in base]
            base_cell = (f" {statistics.median(over_base):.2f} |" if over_base else " - |") if based else ""
            lines.append(
                f"| {task} | {side} | {med['step_s']:.4f} | {med['samples_s']:.0f} | {ratio} |{base_cell} "
                f"{med['cpu_s']:.4f} | "
                f"{cpu_ratio} | {med['tokens_s']:.0f} | {med['sampled_s']:.0f} | {med['rss']:.0f} | "
                f"{med['pss']:.0f} | " + (f"{med['gpu']:.0f} | " if gpu else "") + f"{med['startup']:.1f} |"
            )
    return "\n".join(lines)


def curves(rows: list[dict], tasks: list[str], sides: list[str], window: int, steps: int) -> str:
    spans = [f"{i}-{min(i + window, steps) - 1}" for i in range(0, steps, window)]
    lines = [
        "| task | side | " + " | ".join(f"steps {s}" for s in spans) + " |",
        "|---|---|" + "---|" * len(spans),
    ]
    for task in tasks:
        for side in sides:
            found = [r["curve"] for r in rows if r["task"] == task and r["side"] == side]
            if not found:
                continue
            cells = []
            for i in range(len(spans)):
                points = [c[i] for c in found if i < len(c)]
                cells.append(f"{_mean([p[0] for p in points]):.3f} / {_mean([p[1] for p in points]):.2f}")
            lines.append(f"| {task} | {side} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def per_run(rows: list[dict]) -> str:
    lines = ["| task | side | seed | load | s/step | CPU s/step | samples/s | peak RSS MiB | wall s "
             "| reward first 5 -> last 5 |", "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        s, steps = r["summary"], r["run"]["steps"]
        first, last = _mean([x["reward"] for x in steps[:5]]), _mean([x["reward"] for x in steps[-5:]])
        lines.append(
            f"| {r['task']} | {r['side']} | {r['seed']} | {r['load']:.1f} | {s['step_s']:.4f} | {s['cpu_s']:.4f} | "
            f"{s['samples_s']:.0f} | "
            f"{s['rss']:.0f} | {s['wall']:.1f} | {first:.3f} -> {last:.3f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", choices=sorted(TASKS), default=["digit", "guess"])
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=list(DEFAULT_SIDES))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=30, help="training steps per run")
    parser.add_argument("--warmup", type=int, default=5, help="steps left out of the medians")
    parser.add_argument(
        "--warm-up",
        choices=["sides", "model"],
        default="sides",
        help="the uncounted 2-step runs before the timed ones: one of each side and task, or only the one that "
        "builds a task's model folder where it is missing (when device time is short)",
    )
    parser.add_argument("--window", type=int, default=10, help="steps per learning-curve window")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny", help="the model both sides train")
    parser.add_argument("--out", type=Path, help="default: runs/vs-trl, runs/vs-trl-SHAPE for another shape")
    parser.add_argument("--trl-venv", type=Path, default=REPO / ".venv-trl")
    parser.add_argument("--trl-python", type=Path, help="a python where trl already imports, instead of --trl-venv")
    parser.add_argument("--report", type=Path, help="append the tables and the commands to this markdown file")
    parser.add_argument("--baseline", type=Path, help="another agentrl checkout: each agentrl side again with it")
    args = parser.parse_args()
    if args.steps <= args.warmup + 2:
        parser.error(f"--steps {args.steps} leaves no step to time after --warmup {args.warmup}; raise --steps")
    out = (args.out or REPO / "runs" / ("vs-trl" if args.shape == "tiny" else f"vs-trl-{args.shape}")).resolve()
    lr = SHAPES[args.shape][1]  # both sides' learning rate
    for folder in ("results", "logs", "runs"):
        (out / folder).mkdir(parents=True, exist_ok=True)
    digit.write(out / "digit.jsonl", 512)
    python = None
    if set(args.sides) & set(TRL):
        python = args.trl_python or trl_python(args.trl_venv.resolve())
    if python is not None:
        print("TRL: GRPOConfig changed from its defaults (and why):")
        for task in args.tasks:
            command = [str(python), "benchmarks/vs_trl_side.py", "--task", task, "--print-changes"]
            command += ["--lr", str(lr)]
            command += ["--max-new-tokens", str(TASKS[task]["max_new_tokens"])]
            changes = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=True)
            for field, (value, why) in json.loads(changes.stdout).items():
                print(f"  {task}: {field} = {'(per run)' if value is None else value}: {why}")
    configs = {task: agentrl_config(task, out, args.shape) for task in args.tasks}

    sides = list(args.sides)
    if args.baseline is not None:  # each agentrl side, then the same with the baseline's agentrl
        sides = [named for side in sides for named in ([side] if side in TRL else [side, side + BASE])]

    def one(task: str, side: str, seed: int, steps: int, name: str) -> dict:
        if side in TRL:
            return run_trl(python, side, task, seed, steps, out, name, lr)
        if side.endswith(BASE):
            return run_agentrl(side.removesuffix(BASE), configs[task], seed, steps, out, name, args.baseline.resolve())
        return run_agentrl(side, configs[task], seed, steps, out, name)

    for task in args.tasks:  # warm-up: builds the model folder (agentrl), fills the disk cache; not counted
        warm = (set(sides) if args.warm_up == "sides" else set()) | (
            set() if (out / f"model-{task}").is_dir() else {"agentrl-1"}
        )
        for side in sorted(warm, key=lambda side: side in TRL):  # agentrl's first: it builds the model
            one(task, side, 0, 2, f"warmup-{task}-{side}")
        check_same_tokens(task, out)
    rows = []
    for seed in args.seeds:
        for task in args.tasks:
            for side in sides:
                name = f"{task}-{side}-s{seed}"
                load = os.getloadavg()[0]
                run = one(task, side, seed, args.steps, name)
                row = {"task": task, "side": side, "seed": seed, "load": load, "run": run,
                       "summary": summary(run, args.warmup), "curve": curve(run, args.window)}  # fmt: skip
                rows.append(row)
                print(f"{name}: {row['summary']['step_s']:.4f} s/step, {row['summary']['cpu_s']:.4f} CPU s/step, "
                      f"{row['summary']['samples_s']:.0f} samples/s, "
                      f"peak RSS {row['summary']['rss']:.0f} MiB (load {load:.1f})", flush=True)  # fmt: skip
    (out / "rows.json").write_text(json.dumps(rows) + "\n")
    text = "\n\n".join([
        f"Medians over seeds {args.seeds}, {args.steps} steps a run, steps {args.warmup}+ timed:",
        table(rows, args.tasks, sides),
        f"Learning curve: mean reward / success per {args.window} steps, averaged over the seeds:",
        curves(rows, args.tasks, sides, args.window, args.steps),
        "Every run:",
        per_run(rows),
    ])  # fmt: skip
    print("\n" + text)
    if args.report:
        command = " ".join(["python", "benchmarks/vs_trl.py", *sys.argv[1:]])
        stamp = time.strftime("%Y-%m-%d %H:%M")
        with args.report.open("a") as report:
            report.write(f"\n## {stamp}: `{command}`\n\n{text}\n")


if __name__ == "__main__":
    main()
