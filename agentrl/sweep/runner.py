"""One trial's training process: started on its cores, watched at each evaluation (reported to the study, pruned
with the graceful stop), its heartbeat kept, its end told to the study."""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from agentrl.run.preempt import EXIT_STOPPED
from agentrl.sweep import require
from agentrl.sweep.objective import read_scalars, reduce
from agentrl.sweep.study import HEARTBEAT_S, Claim, Sweep

PR_SET_PDEATHSIG = 1


def _stop_when_parent_dies() -> None:
    """In the child before exec (Linux): SIGTERM, the graceful stop, when the sweep that started it dies."""
    with contextlib.suppress(OSError, AttributeError):  # not Linux: a killed sweep leaves its trials running
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def launch_command(ranks: int, agentrl_command: list[str] | None = None) -> list[str]:
    """`agentrl train` alone, or under the venv's mpirun for several ranks; `agentrl_command` replaces `agentrl`."""
    agentrl = agentrl_command or [shutil.which("agentrl", path=str(Path(sys.executable).parent)) or "agentrl"]
    if ranks == 1:
        return [*agentrl, "train"]
    mpirun = shutil.which("mpirun", path=str(Path(sys.executable).parent)) or shutil.which("mpirun")
    if mpirun is None:
        from agentrl.errors import UserError

        raise UserError(f"ranks: {ranks} runs each trial under mpirun, which is not found; pip install mpich")
    return [mpirun, "-n", str(ranks), *agentrl, "train"]


class TrialRun:
    """Start with `start()`, call `poll()` about once a second until it returns the trial's final state."""

    def __init__(self, sweep: Sweep, study, claim: Claim, cores: list[int] | None):
        self.sweep, self.study, self.claim, self.cores = sweep, study, claim, cores
        optuna = require("optuna")
        self.trial = optuna.trial.Trial(study, claim.trial_id)
        self.states = optuna.trial.TrialState
        self.run_dir = sweep.trial_dir(claim.number)
        self.total_steps = sweep.total_steps(claim.number)
        self.reported = set(study._storage.get_trial(claim.trial_id).intermediate_values)
        self.process: subprocess.Popen | None = None
        self.pruned = False
        self.stopping = False
        self.last_beat = 0.0
        self.started = time.time()

    @property
    def ranks(self) -> int:
        return self.sweep.spec.ranks_for(self.claim.params.get("base"))

    def command(self) -> list[str]:
        threads = max(1, len(self.cores) // self.ranks) if self.cores else 0
        launch = launch_command(self.ranks, self.sweep.spec.agentrl_command)
        command = [*launch, str(self.sweep.config_path(self.claim.number))]
        command += [f"runtime.torch_threads={threads}", "logging.progress=false"]
        return command + (["resume=true"] if self.claim.resume else [])

    def start(self) -> None:
        env = dict(os.environ)
        if self.cores:
            env["OMP_NUM_THREADS"] = str(max(1, len(self.cores) // self.ranks))
        cores = self.cores

        def before_exec():
            _stop_when_parent_dies()
            if cores and hasattr(os, "sched_setaffinity"):
                os.sched_setaffinity(0, cores)

        log = open(self.sweep.log_path(self.claim.number), "a")  # noqa: SIM115 (closed by the child's exit)
        log.write(f"agentrl sweep: attempt {self.claim.attempt}: {' '.join(self.command())}\n")
        log.flush()
        self.process = subprocess.Popen(
            self.command(),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            preexec_fn=before_exec,
            start_new_session=True,  # a Ctrl-C at the sweep's terminal reaches the sweep, which stops its trials
        )
        log.close()
        self.sweep.heartbeat(self.claim.number, training_pid=self.process.pid, cores=cores)

    def stop(self) -> None:
        """The graceful stop: the trial checkpoints and exits 75 (agentrl/run/preempt.py); mpirun passes it on."""
        if self.process is not None and self.process.poll() is None and not self.stopping:
            self.stopping = True
            self.process.send_signal(signal.SIGTERM)

    def poll(self) -> str | None:
        """None while the trial runs; then 'complete', 'pruned', 'failed' or 'stopped' (resumable)."""
        now = time.time()
        if now - self.last_beat >= HEARTBEAT_S:
            self.sweep.heartbeat(self.claim.number)
            self.last_beat = now
        self.report_evaluations()
        code = self.process.poll()
        if code is None:
            return None
        self.report_evaluations()
        return self.finish(code)

    def report_evaluations(self) -> None:
        """Each new eval report (run_dir/eval/step_N.json) -> the objective up to step N -> the study -> prune?"""
        if self.pruned:
            return
        steps = sorted(int(p.stem.removeprefix("step_")) for p in (self.run_dir / "eval").glob("step_*.json"))
        new = [step for step in steps if step not in self.reported and step > 0]
        if not new:
            return
        points = read_scalars(self.run_dir, self.sweep.spec.objective.scalar)
        for step in new:
            value = reduce([p for p in points if p[0] <= step], self.sweep.spec.objective, self.total_steps)
            if value is None:
                continue  # its scalars are not on disk yet: taken at the next poll
            self.trial.report(value, step)
            self.reported.add(step)
            if step < self.total_steps and self.trial.should_prune():
                self.pruned = True
                self.sweep.heartbeat(self.claim.number, pruned_at=step)
                self.stop()
                return

    def finish(self, code: int) -> str:
        number, objective = self.claim.number, self.sweep.spec.objective
        earlier = (self.sweep.read_runner(number) or {}).get("wall_s", 0.0)  # the starts before a resume
        record = {"exit_code": code, "wall_s": round(earlier + time.time() - self.started, 1)}
        if self.pruned and code in (0, EXIT_STOPPED):
            self.study.tell(number, state=self.states.PRUNED)
            state = "pruned"
        elif code == 0:
            points = read_scalars(self.run_dir, objective.scalar)
            value = reduce(points, objective, self.total_steps)
            if value is None:
                self.study.tell(number, state=self.states.FAIL)
                record["reason"] = f"{objective.scalar} was never logged; check objective.scalar in the spec"
                state = "failed"
            else:
                self.study.tell(number, value)
                state = "complete"
        elif code == EXIT_STOPPED or (self.stopping and code in (-signal.SIGTERM, 128 + signal.SIGTERM)):
            # stopped with a checkpoint (the sweep was stopped), or by the stop's SIGTERM itself while it was still
            # starting, before agentrl's handler was in place: a resumed sweep continues it (or starts it again)
            state = "stopped"
        else:
            self.study.tell(number, state=self.states.FAIL)
            record["reason"] = f"exit {code}; see {self.sweep.log_path(number)}"
            state = "failed"
        self.sweep.heartbeat(number, state=state, **record)
        return state
