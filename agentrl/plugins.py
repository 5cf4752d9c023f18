"""Plug-ins by name, as Gymnasium finds envs: in-process registrations, a `module:attribute` path, or an entry point
group of an installed package. Envs (agentrl/env/registry.py) and algorithms (agentrl/algorithms/registry.py) each
keep one `Registry`."""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from importlib.metadata import entry_points


class Registry:
    """Names of one kind of plug-in (`what`: "env id", "algorithm") -> what they load.

    `register_call` names the function users register with, for error messages; `overwrite`: whether a name may
    be registered again with another target (else that is an error naming both).

    What a name loads is kept after its first resolve, and the entry point group is read once: a run resolves
    its env once per episode, and scanning every installed package's metadata costs milliseconds each time. A
    name found nowhere rescans once, so a package installed while the process runs is still found.
    """

    def __init__(self, what: str, group: str, register_call: str, overwrite: bool = False):
        self.what, self.group, self.register_call, self.overwrite = what, group, register_call, overwrite
        self._targets: dict[str, object] = {}
        self._loaded: dict[str, object] = {}
        self._installed: dict | None = None

    def register(self, name: str, target) -> None:
        """`name` -> an object or its `"module:attribute"` path, loaded on first use."""
        taken = self._targets.get(name)
        if not self.overwrite and taken is not None and taken != target:
            raise ValueError(
                f"{self.what} {name!r} is already registered ({taken!r}); pick another name for {target!r}"
            )
        self._targets[name] = target
        self._loaded.pop(name, None)

    def names(self) -> list[str]:
        return sorted(set(self._targets) | set(self._entry_points()))

    def resolve(self, name: str, hint: str = ""):
        """What `name` stands for, imported now; KeyError naming the close names and how to add one (`hint`
        appended)."""
        loaded = self._loaded.get(name)
        if loaded is None:
            loaded = self._loaded[name] = self._load(name, hint)
        return loaded

    def _load(self, name: str, hint: str):
        if name in self._targets:
            target = self._targets[name]
            return load_callable(target, self.what) if isinstance(target, str) else target
        installed = self._entry_points()
        if name not in installed and ":" not in name:
            installed = self._entry_points(rescan=True)
        if name in installed:
            return installed[name].load()
        if ":" in name:
            return load_callable(name, self.what)
        known = ", ".join(self.names()) or "none"
        raise KeyError(
            f"unknown {self.what} {name!r}{did_you_mean(name, self.names())}; known: {known}. Use one of them, a "
            f"'module:Class' path, or register yours with {self.register_call} or the '{self.group}' entry point "
            f"group{hint}"
        )

    def _entry_points(self, rescan: bool = False) -> dict:
        if self._installed is None or rescan:
            self._installed = {ep.name: ep for ep in entry_points(group=self.group)}
        return self._installed


def did_you_mean(name: str, choices) -> str:
    """`" (did you mean 'x'?)"` for the closest of `choices`, or "" when none is close (as Gymnasium hints)."""
    close = difflib.get_close_matches(name, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def load_callable(path: str, what: str = "env") -> Callable:
    """The object at `"module:attribute"`; errors name `what` the path was given for."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{what} {path!r} must look like 'package.module:name'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ImportError(f"cannot import module {module_name!r} for {what} {path!r}: {error}") from error
    try:
        return getattr(module, attr)
    except AttributeError:
        hint = did_you_mean(attr, [name for name in dir(module) if not name.startswith("_")])
        raise AttributeError(f"module {module_name!r} has no attribute {attr!r}{hint}; {what} {path!r}") from None
