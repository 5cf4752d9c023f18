"""Rank 0 claims the run folder before anything heavy is loaded: created, writable, locked for this run."""

from __future__ import annotations

from pathlib import Path

from agentrl import transport
from agentrl.config import Config
from agentrl.errors import UserError
from agentrl.run.lock import RunLock
from agentrl.run.supervise import restart_count

RESTART_LOCK_WAIT_S = 30.0  # a restarted job waits this long for its previous start's rank 0 to be gone


def claim(config: Config, command: list[str], world) -> RunLock | None:
    """Every rank calls this; rank 0 returns the lock it now holds (release it on every way out), others None.

    A folder that cannot be made or written, or one another run holds, raises
    RefusedOnEveryRank on every rank.
    """
    lock = RunLock(config.run_dir) if world.Get_rank() == 0 else None

    def take() -> str | None:
        run_dir = Path(config.run_dir)
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            return lock.acquire(command, wait_s=RESTART_LOCK_WAIT_S if restart_count() else 0.0)
        except OSError as error:
            raise UserError(
                f"run_dir={run_dir} cannot be created or written ({error.strerror}: {error.filename}); "
                "choose a folder you can write, e.g. run_dir=runs/NAME"
            ) from None

    note = transport.agree_on_root(world, take)
    if note and lock is not None:
        print(f"agentrl: {note}", flush=True)
    return lock
