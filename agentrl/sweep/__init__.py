"""`agentrl sweep`: hyperparameter sweeps where every trial is an ordinary run folder (Optuna study, local or SLURM)."""

from __future__ import annotations

from agentrl.errors import UserError

INSTALL_HINT = "pip install 'agentrl[sweep]' (optuna and matplotlib)"


def require(module: str):
    """Import an optional dependency of sweeps, or say which extra brings it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise UserError(f"agentrl sweep needs {module.split('.')[0]}, which is not installed; {INSTALL_HINT}") from None
