"""The Optuna study in the sweep folder (a file journal, safe for concurrent SLURM tasks) and how a runner claims
its next trial: a dead trial to resume first, else a new one, never one that runs elsewhere."""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from agentrl.config.load import from_dict
from agentrl.errors import UserError
from agentrl.file_lock import file_lock
from agentrl.run.lock import LOCK_FILE, owner_record, why_stale
from agentrl.sections import ConfigError
from agentrl.sweep import require
from agentrl.sweep.space import base_data, group_trial, suggest, trial_data
from agentrl.sweep.spec import SweepSpec, dump_spec, parse_spec

STUDY_NAME = "sweep"
JOURNAL = "study.journal"
SPEC_FILE = "spec.yaml"
HEARTBEAT_S = 5.0
STALE_S = 60.0  # a runner on another host whose heartbeat is older than this is gone
MAX_ATTEMPTS = 3  # starts of one trial (the first and two resumes) before it is marked failed


def _ask_tell_grid(optuna):
    class AskTellGridSampler(optuna.samplers.GridSampler):
        """GridSampler without its `study.stop()` after the last point, which only `study.optimize` allows; the
        sweep's budget (the grid's size) ends it instead."""

        def after_trial(self, study, trial, state, values) -> None:
            return None

    return AskTellGridSampler


@dataclass
class Claim:
    """One trial this runner now owns: its Optuna trial, values, seed, and whether it continues a dead start."""

    number: int
    trial_id: int
    params: dict
    seed: int
    attempt: int

    @property
    def resume(self) -> bool:
        return self.attempt > 1


class Sweep:
    """The sweep folder: spec, study, and the per-trial files (configs/, runners/, logs/, trials/)."""

    def __init__(self, spec: SweepSpec):
        self.spec = spec
        self.dir = Path(spec.sweep_dir)

    def trial_dir(self, number: int) -> Path:
        return self.dir / "trials" / f"{number:04d}"

    def config_path(self, number: int) -> Path:
        return self.dir / "configs" / f"{number:04d}.yaml"

    def runner_path(self, number: int) -> Path:
        return self.dir / "runners" / f"{number:04d}.json"

    def log_path(self, number: int) -> Path:
        return self.dir / "logs" / f"{number:04d}.log"

    # --- the study -----------------------------------------------------------------------------------------------

    def storage(self):
        journal = require("optuna.storages.journal")
        path = str(self.dir / JOURNAL)
        return journal.JournalStorage(journal.JournalFileBackend(path, lock_obj=journal.JournalFileOpenLock(path)))

    def study(self, sampler_salt: int = 0):
        """Load (or create) the study; `sampler_salt` keeps concurrent or resumed runners from drawing alike."""
        optuna = require("optuna")
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        spec = self.spec
        seed = spec.sampler_seed + 7919 * sampler_salt
        if spec.method == "grid":
            sampler = _ask_tell_grid(optuna)(spec.grid_space(), seed=spec.sampler_seed)
        elif spec.method == "random":
            sampler = optuna.samplers.RandomSampler(seed=seed)
        else:
            sampler = optuna.samplers.TPESampler(seed=seed)
        p = spec.pruner
        if p.name == "median":
            pruner = optuna.pruners.MedianPruner(n_startup_trials=p.startup_trials, n_warmup_steps=p.warmup_steps)
        elif p.name == "halving":
            pruner = optuna.pruners.SuccessiveHalvingPruner(
                min_resource=p.min_resource or self.eval_every(), reduction_factor=p.reduction_factor
            )
        else:
            pruner = optuna.pruners.NopPruner()
        return optuna.create_study(
            study_name=STUDY_NAME,
            storage=self.storage(),
            sampler=sampler,
            pruner=pruner,
            direction=spec.objective.direction,
            load_if_exists=True,
        )

    def eval_every(self) -> int:
        name = next(iter(self.spec.named_bases()))
        return from_dict(trial_data(base_data(self.spec, name), {}, self.spec.seeds[0], self.trial_dir(0))).eval.every

    def total_steps(self, number: int) -> int:
        return int(yaml.safe_load(self.config_path(number).read_text())["steps"])

    # --- starting and resuming -----------------------------------------------------------------------------------

    def create_or_check(self, resume: bool) -> None:
        """A new sweep writes its spec; `--resume` (and every SLURM task) needs the same spec as the one started."""
        saved = self.dir / SPEC_FILE
        if saved.is_file():
            previous = parse_spec(yaml.safe_load(saved.read_text()), str(saved))
            if previous != self.spec:
                changed = [k for k in type(self.spec).model_fields if getattr(previous, k) != getattr(self.spec, k)]
                raise UserError(
                    f"sweep_dir {self.dir} was started with another spec (changed: {', '.join(changed)}); restore "
                    f"{', '.join(changed)} as in {saved}, or choose a new sweep_dir"
                )
            if not resume:
                raise UserError(
                    f"sweep_dir {self.dir} holds a sweep already; continue it with `agentrl sweep SPEC --resume`, "
                    "or choose a new sweep_dir"
                )
            return
        for sub in ("trials", "configs", "runners", "logs"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        tmp = saved.with_name(saved.name + f".tmp{os.getpid()}")
        tmp.write_text(dump_spec(self.spec))
        os.replace(tmp, saved)

    def claim_lock(self):
        return file_lock(self.dir / "claim.lock")

    def claim_next(self, study) -> Claim | None:
        """Under the claim lock: a dead trial to resume, else a new trial while the budget lasts, else None."""
        optuna = require("optuna")
        with self.claim_lock():
            trials = study.get_trials(deepcopy=False)
            for trial in trials:
                if trial.state != optuna.trial.TrialState.RUNNING or self.runner_alive(trial.number):
                    continue
                if self.training_alive(trial.number):
                    continue  # its runner is gone and its training is still stopping: take it once it ended
                record = self.read_runner(trial.number) or {}
                attempt = record.get("attempt", 1) + 1
                if attempt > MAX_ATTEMPTS:
                    study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
                    self.write_runner(trial.number, {**record, "state": "failed", "reason": "started too often"})
                    continue
                params = {key: value for key, value in trial.params.items() if key != "seed"}
                claim = Claim(trial.number, trial._trial_id, params, trial.user_attrs["seed"], attempt)
                self.write_runner(trial.number, {**record, **self.runner_record(claim)})
                return claim
            started = sum(t.state != optuna.trial.TrialState.WAITING for t in trials)
            if started >= self.spec.budget():
                return None
            trial = study.ask()
            params = suggest(trial, self.spec)
            if self.spec.method == "grid":
                seed = int(params.pop("seed", self.spec.seeds[0]))
            else:
                seed = trial.user_attrs.get("seed")
                if seed is None:  # a new point: its other seeds wait in the queue, taken next
                    seed = self.spec.seeds[0]
                    for other in self.spec.seeds[1:]:
                        study.enqueue_trial(params, user_attrs={"seed": other})
            trial.set_user_attr("seed", seed)
            trial.set_user_attr("run_dir", str(self.trial_dir(trial.number)))
            claim = Claim(trial.number, trial._trial_id, params, seed, 1)
            self.write_config(claim)
            self.write_runner(claim.number, self.runner_record(claim))
            return claim

    def waiting_to_resume(self, study) -> bool:
        """Whether a trial whose runner is gone is still stopping (claimable once its training has ended)."""
        optuna = require("optuna")
        return any(
            t.state == optuna.trial.TrialState.RUNNING
            and not self.runner_alive(t.number)
            and self.training_alive(t.number)
            for t in study.get_trials(deepcopy=False)
        )

    def write_config(self, claim: Claim) -> Path:
        base = base_data(self.spec, claim.params.get("base"))
        data = trial_data(base, claim.params, claim.seed, self.trial_dir(claim.number))
        data = group_trial(data, self.dir, claim.number)
        try:
            from_dict(data, source=f"trial {claim.number}")
        except ConfigError as error:
            raise UserError(
                f"trial {claim.number} with {claim.params} is refused by the config loader:\n{error}"
            ) from None
        path = self.config_path(claim.number)
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    # --- who runs what -------------------------------------------------------------------------------------------

    def runner_record(self, claim: Claim) -> dict:
        record = owner_record()
        return {
            **record,
            "trial": claim.number,
            "run_dir": str(self.trial_dir(claim.number)),
            "attempt": claim.attempt,
            "heartbeat": time.time(),
            "state": "running",
        }

    def read_runner(self, number: int) -> dict | None:
        try:
            return json.loads(self.runner_path(number).read_text())
        except (OSError, ValueError):
            return None

    def write_runner(self, number: int, record: dict) -> None:
        path = self.runner_path(number)
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(record, indent=1))
        os.replace(tmp, path)

    def heartbeat(self, number: int, **fields) -> None:
        record = self.read_runner(number) or {}
        self.write_runner(number, {**record, **fields, "heartbeat": time.time()})

    def runner_alive(self, number: int) -> bool:
        """Whether the runner that claimed this trial may still be watching it (pid on this host, else heartbeat)."""
        record = self.read_runner(number)
        if record is None or record.get("state") != "running":
            return False
        if why_stale(record) is not None:
            return False
        if record.get("host") == socket.gethostname() and isinstance(record.get("pid"), int):
            return True  # why_stale found its pid alive here: a runner busy for a minute is not a dead one
        return time.time() - record.get("heartbeat", 0) < STALE_S

    def training_alive(self, number: int) -> bool:
        """Whether the trial's training still holds its run folder's lock (a graceful stop still checkpointing)."""
        try:
            holder = json.loads((self.trial_dir(number) / LOCK_FILE).read_text())
        except (OSError, ValueError):
            return False
        return why_stale(holder) is None
