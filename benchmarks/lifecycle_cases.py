"""Reproduce the run-lifecycle cases of issue 12 (items 2-6) and print one table row per case.

Each case launches real `mpirun -n 4 agentrl train launch/configs/quickstart.yaml ...` jobs
(short: a few dozen steps) from WORK_DIR and reports the exit codes, the lines and
tracebacks printed, the wall time and what the run folder holds afterwards. Run it
against any checkout by putting that checkout first on PYTHONPATH:

    PYTHONPATH=$PWD python benchmarks/lifecycle_cases.py --work /tmp/lifecycle [--cases lock_seed,ctrl_c]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "launch" / "configs" / "quickstart.yaml"
RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")


class Job:
    """One launched command: its output goes to files so a chatty job never blocks on a full pipe."""

    def __init__(self, work: Path, name: str, command: list[str], env: dict | None = None):
        self.name = name
        self.command = command
        self.out_path = work / "logs" / f"{name}.log"
        self.out_path.parent.mkdir(parents=True, exist_ok=True)
        self.out = self.out_path.open("w")
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            command, cwd=work, stdout=self.out, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )

    def finish(self, timeout_s: float) -> tuple[int | str, float]:
        try:
            code = self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
            code = f"hung>{timeout_s:.0f}s"
        self.out.close()
        return code, time.monotonic() - self.started

    @property
    def output(self) -> str:
        return self.out_path.read_text(errors="replace")


def train_command(run_dir: str, *overrides: str, n: int = 4, config: Path = QUICKSTART) -> list[str]:
    return ["mpirun", "-n", str(n), "agentrl", "train", str(config), f"run_dir={run_dir}", *overrides]


def shown(command: list[str]) -> str:
    return " ".join(str(part).replace(str(ROOT) + "/", "") for part in command)


def lines(text: str) -> int:
    return len([line for line in text.splitlines() if line.strip()])


def tracebacks(text: str) -> int:
    return text.count("Traceback (most recent call last)")


def rank_pids(run_dir: Path) -> dict[int, int]:
    """{world rank: pid} of the ranks whose command line names run_dir (read from /proc, Linux)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"run_dir={run_dir}" not in cmdline or "agentrl" not in cmdline:
            continue
        variables = dict(item.decode(errors="replace").partition("=")[::2] for item in environ if b"=" in item)
        rank = next((variables[name] for name in RANK_VARIABLES if name in variables), None)
        if rank is not None:
            found[int(rank)] = int(entry.name)
    return found


def wait_for(condition, timeout_s: float, job: Job) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if job.process.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def checkpoints(run_dir: Path) -> list[str]:
    root = run_dir / "checkpoints"
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


def has_checkpoint(run_dir: Path, step: int) -> bool:
    return (run_dir / "checkpoints" / f"step_{step:06d}" / "trainer_state.pt").is_file()


def logged_steps(run_dir: Path, tag: str = "episode/count") -> Counter:
    """How often TensorBoard shows each step of `tag`: the folder read as TensorBoard reads it (restart purges)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    if not (run_dir / "tb").is_dir():
        return Counter()
    accumulator = EventAccumulator(str(run_dir / "tb"))
    accumulator.Reload()
    if tag not in accumulator.Tags()["scalars"]:
        return Counter()
    return Counter(event.step for event in accumulator.Scalars(tag))


def raw_logged_steps(run_dir: Path, tag: str = "episode/count") -> Counter:
    """Points of `tag` in the event files themselves, every file read on its own (no purges)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    counts: Counter = Counter()
    for path in sorted((run_dir / "tb").glob("events.out.tfevents.*")):
        accumulator = EventAccumulator(str(path), purge_orphaned_data=False)
        accumulator.Reload()
        if tag in accumulator.Tags()["scalars"]:
            counts.update(event.step for event in accumulator.Scalars(tag))
    return counts


def describe_steps(counts: Counter) -> str:
    twice = sorted(step for step, n in counts.items() if n > 1)
    repeated = f" ({twice[0]}..{twice[-1]})" if twice else ""
    return f"{len(counts)} steps shown, {len(twice)} of them more than once{repeated}"


def saved_seed(run_dir: Path) -> str:
    path = run_dir / "config.yaml"
    if not path.is_file():
        return "none"
    match = re.search(r"^seed: (\S+)", path.read_text(), re.MULTILINE)
    return match.group(1) if match else "?"


def last_line(text: str, pattern: str = r"agentrl|Error|error") -> str:
    matching = [line.strip() for line in text.splitlines() if re.search(pattern, line)]
    return (matching[-1] if matching else "(none)")[:160]


SHORT = ("checkpoint.every=5", "logging.progress=false")


# ---------------------------------------------------------------- item 2: two runs, one run_dir


def case_lock_seed(work: Path) -> dict:
    run = work / "runs" / "lock_seed"
    first = Job(work, "lock_seed_a", train_command(str(run), "seed=0", "steps=20", *SHORT))
    wait_for(lambda: (run / "config.yaml").is_file(), 120, first)
    time.sleep(3)
    second = Job(work, "lock_seed_b", train_command(str(run), "seed=1", "steps=20", *SHORT))
    code_b, wall_b = second.finish(600)
    code_a, _ = first.finish(600)
    return {
        "command": shown(second.command) + "  (while the same with seed=0 runs)",
        "exit": f"first {code_a}, second {code_b}",
        "lines": lines(second.output),
        "tracebacks": tracebacks(second.output),
        "wall_s": wall_b,
        "result": f"config.yaml seed={saved_seed(run)}; TensorBoard: {describe_steps(raw_logged_steps(run))}; "
        f"second says: {last_line(second.output)}",
    }


def case_lock_resume(work: Path) -> dict:
    run = work / "runs" / "lock_resume"
    first = Job(work, "lock_resume_a", train_command(str(run), "steps=20", *SHORT))
    wait_for(lambda: has_checkpoint(run, 5), 300, first)
    second = Job(work, "lock_resume_b", train_command(str(run), "steps=20", "resume=true", *SHORT))
    code_b, wall_b = second.finish(600)
    code_a, _ = first.finish(600)
    return {
        "command": shown(second.command) + "  (while the first run is past step 5)",
        "exit": f"first {code_a}, second {code_b}",
        "lines": lines(second.output),
        "tracebacks": tracebacks(second.output),
        "wall_s": wall_b,
        "result": f"TensorBoard: {describe_steps(raw_logged_steps(run))}; second says: {last_line(second.output)}",
    }


# ---------------------------------------------------------------- item 3: corrupt checkpoints


def finished_run(work: Path) -> Path:
    """A 10-step run with checkpoints at steps 5 and 10, made once and copied by each case."""
    run = work / "runs" / "base10"
    if not has_checkpoint(run, 10):
        shutil.rmtree(run, ignore_errors=True)
        job = Job(work, "base10", train_command(str(run), "steps=10", *SHORT))
        code, _ = job.finish(600)
        assert code == 0, job.output[-3000:]
    return run


def truncate(path: Path) -> None:
    with path.open("r+b") as handle:
        handle.truncate(path.stat().st_size // 2)


def corrupt_case(work: Path, name: str, damage) -> dict:
    run = work / "runs" / name
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(finished_run(work), run)
    damage(run / "checkpoints")
    before = checkpoints(run)
    job = Job(work, name, train_command(str(run), "steps=15", "resume=true", *SHORT))
    code, wall = job.finish(600)
    started = re.search(r"resuming from \S+ at step (\d+)|starting at step (\d+)", job.output)
    return {
        "command": shown(job.command),
        "exit": code,
        "lines": lines(job.output),
        "tracebacks": tracebacks(job.output),
        "wall_s": wall,
        "result": f"started at step {next((g for g in started.groups() if g), '?') if started else '?'}; "
        f"folders {before} -> {checkpoints(run)}; says: {last_line(job.output, r'agentrl|Error')}",
    }


def case_corrupt_weights(work: Path) -> dict:
    return corrupt_case(work, "corrupt_weights", lambda root: truncate(root / "step_000010" / "model.safetensors"))


def case_corrupt_state(work: Path) -> dict:
    return corrupt_case(work, "corrupt_state", lambda root: truncate(root / "step_000010" / "trainer_state.pt"))


def case_no_good_checkpoint(work: Path) -> dict:
    def damage(root: Path) -> None:
        for folder in root.iterdir():
            (folder / "trainer_state.pt").unlink()

    return corrupt_case(work, "no_good_checkpoint", damage)


# ---------------------------------------------------------------- item 4: kill -9, Ctrl-C, SIGTERM to one rank


def case_kill9_resume(work: Path) -> dict:
    run = work / "runs" / "kill9"
    job = Job(work, "kill9_a", train_command(str(run), "steps=20", *SHORT))
    wait_for(lambda: has_checkpoint(run, 5), 300, job)
    time.sleep(4)  # a few steps past the checkpoint
    killed_at = time.monotonic()
    os.kill(rank_pids(run)[1], signal.SIGKILL)
    code_a, _ = job.finish(120)
    ended_after = time.monotonic() - killed_at
    resumed = Job(work, "kill9_b", train_command(str(run), "steps=20", "resume=true", *SHORT))
    code, wall = resumed.finish(600)
    return {
        "command": f"kill -9 <rollout rank 1 pid> during `{shown(job.command)}`; then the same with resume=true",
        "exit": f"killed job {code_a} after {ended_after:.1f}s; resume {code}",
        "lines": lines(job.output) + lines(resumed.output),
        "tracebacks": tracebacks(job.output) + tracebacks(resumed.output),
        "wall_s": wall,
        "result": f"TensorBoard as read: {describe_steps(logged_steps(run))}; raw files: "
        f"{describe_steps(raw_logged_steps(run))}",
    }


def interrupt_case(work: Path, name: str, presses: int) -> dict:
    run = work / "runs" / name
    job = Job(work, name, train_command(str(run), "steps=40", *SHORT))
    wait_for(lambda: has_checkpoint(run, 5), 300, job)
    time.sleep(1)
    pressed = time.monotonic()
    for press in range(presses):  # what Ctrl-C in a terminal does: SIGINT to the foreground process group
        if press:
            time.sleep(0.5)
            pressed = time.monotonic()
        os.killpg(job.process.pid, signal.SIGINT)
    code, _ = job.finish(120)
    return {
        "command": f"Ctrl-C x{presses} (SIGINT to the process group) during `{shown(job.command)}`",
        "exit": code,
        "lines": lines(job.output),
        "tracebacks": tracebacks(job.output),
        "wall_s": time.monotonic() - pressed,
        "result": f"checkpoints {checkpoints(run)}; says: {last_line(job.output)}",
    }


def case_ctrl_c(work: Path) -> dict:
    return interrupt_case(work, "ctrl_c", 1)


def case_ctrl_c_twice(work: Path) -> dict:
    return interrupt_case(work, "ctrl_c_twice", 2)


def case_sigterm_rollout(work: Path) -> dict:
    run = work / "runs" / "sigterm_rollout"
    job = Job(work, "sigterm_rollout", train_command(str(run), "steps=30", *SHORT))
    wait_for(lambda: has_checkpoint(run, 5), 300, job)
    signalled = time.monotonic()
    os.kill(rank_pids(run)[1], signal.SIGTERM)
    code, _ = job.finish(300)
    return {
        "command": f"kill -TERM <rollout rank 1 pid> during `{shown(job.command)}`",
        "exit": code,
        "lines": lines(job.output),
        "tracebacks": tracebacks(job.output),
        "wall_s": time.monotonic() - signalled,
        "result": f"checkpoints {checkpoints(run)}; TensorBoard steps {len(logged_steps(run))}; "
        f"says: {last_line(job.output)}",
    }


# ---------------------------------------------------------------- item 5: restart after a crash


def case_restart(work: Path) -> dict:
    run = work / "runs" / "restart"
    command = ["bash", str(ROOT / "launch" / "mpirun.sh"), "--max-restarts", "2", "4", str(QUICKSTART)]
    command += [f"run_dir={run}", "steps=20", *SHORT]
    job = Job(work, "restart", command)
    wait_for(lambda: has_checkpoint(run, 5), 300, job)
    time.sleep(3)
    pids = rank_pids(run)
    if 2 in pids:
        os.kill(pids[2], signal.SIGKILL)
    code, wall = job.finish(600)
    return {
        "command": f"kill -9 <rollout rank 2 pid> during `{shown(command)}`",
        "exit": code,
        "lines": lines(job.output),
        "tracebacks": tracebacks(job.output),
        "wall_s": wall,
        "result": f"checkpoints {checkpoints(run)}; TensorBoard: {describe_steps(logged_steps(run))}; "
        f"says: {last_line(job.output, r'restart')}",
    }


# ---------------------------------------------------------------- item 6: error noise and the end of a run


def error_case(work: Path, name: str, command: list[str], pattern: str = r"agentrl|Error") -> dict:
    job = Job(work, name, command)
    code, wall = job.finish(300)
    return {
        "command": shown(command),
        "exit": code,
        "lines": lines(job.output),
        "tracebacks": tracebacks(job.output),
        "wall_s": wall,
        "result": last_line(job.output, pattern),
    }


def case_yaml_typo(work: Path) -> dict:
    typo = work / "typo.yaml"
    typo.write_text(QUICKSTART.read_text().replace("steps: 800", "steps 800\n  bad: ["))
    return error_case(work, "yaml_typo", train_command("runs/typo", config=typo))


def case_missing_model(work: Path) -> dict:
    command = train_command("runs/missing_model", "model.path=models/my/model", "model.tiny=null")
    return error_case(work, "missing_model", command)


def case_config_error(work: Path) -> dict:
    return error_case(work, "config_error", train_command("runs/config_error", "rollout.group_size=1"))


def case_layout_error(work: Path) -> dict:
    return error_case(work, "layout_error", train_command("runs/layout_error", n=3))


def case_run_dir_error(work: Path) -> dict:
    return error_case(work, "run_dir_error", train_command("/etc/hostname/run"))


def case_end_of_run(work: Path) -> dict:
    run = work / "runs" / "end_of_run"
    shutil.rmtree(run, ignore_errors=True)
    job = Job(work, "end_of_run", train_command(str(run), "steps=10"))
    code, wall = job.finish(600)
    tail = [line.strip() for line in job.output.splitlines() if line.strip()][-8:]
    return {
        "command": shown(job.command),
        "exit": code,
        "lines": lines(job.output),
        "tracebacks": tracebacks(job.output),
        "wall_s": wall,
        "result": " / ".join(line[-110:] for line in tail),
    }


CASES = {
    "lock_seed": case_lock_seed,
    "lock_resume": case_lock_resume,
    "corrupt_weights": case_corrupt_weights,
    "corrupt_state": case_corrupt_state,
    "no_good_checkpoint": case_no_good_checkpoint,
    "kill9_resume": case_kill9_resume,
    "ctrl_c": case_ctrl_c,
    "ctrl_c_twice": case_ctrl_c_twice,
    "sigterm_rollout": case_sigterm_rollout,
    "restart": case_restart,
    "yaml_typo": case_yaml_typo,
    "missing_model": case_missing_model,
    "config_error": case_config_error,
    "layout_error": case_layout_error,
    "run_dir_error": case_run_dir_error,
    "end_of_run": case_end_of_run,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, required=True, help="folder the jobs run in (runs/ and logs/ go there)")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, from: {', '.join(CASES)}")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    print("| case | command | exit | lines | tracebacks | wall s | result |\n|---|---|---|---|---|---|---|", flush=True)
    for name in args.cases.split(","):
        shutil.rmtree(args.work / "runs" / name, ignore_errors=True)
        row = CASES[name](args.work)
        print(
            f"| {name} | `{row['command']}` | {row['exit']} | {row['lines']} | {row['tracebacks']} | "
            f"{row['wall_s']:.1f} | {row['result']} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
