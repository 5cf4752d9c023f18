"""The shape of the house: agentrl/'s import graph and a few counts a newcomer feels, printed as a table.

    python benchmarks/house.py [--root agentrl] [--list]

A measurement of the code (no import of it; `ast` only), so it runs on any checkout. What it counts:

- files directly under agentrl/ (every `*.py` there, `__init__.py` included);
- import arrows: module A imports module B, whether at module level or inside a function. `from P import name` is
  an arrow to `P.name` when that is a module, else to `P`; `import P.Q` is an arrow to `P.Q`. Only modules of
  agentrl/ count;
- import circles: strongly connected components of that graph with two or more modules;
- top-level folders: the packages and modules directly under agentrl/ (`agentrl/rollout/`, `agentrl/transport.py`);
  an arrow between modules of two of them is an arrow between the two. A two-way tie is a pair with arrows both
  ways;
- upward arrows: LAYERS below orders the top-level folders, leaf utilities first, commands and the cli last; an
  arrow from a folder to one in a higher layer is upward (a lower part reaching into what is built from it).
  Arrows within one layer are not upward (a two-way tie between them is still counted as a tie). A top-level
  folder LAYERS does not name is listed as unplaced;
- long parameter lists: functions and constructors (`__init__`) with more than 8 parameters, `self`/`cls`,
  `*args` and `**kwargs` excluded (keyword-only ones included);
- helper names defined more than once: a module-level function name defined in two or more modules
  (INTERFACE_NAMES, which commands and the plug-in registries define by contract, excepted);
- the walk of `config`: from WALK_START (`train()` of `agentrl train`), follow every call that passes `config` or
  a section of it (an attribute chain of section names, e.g. `config.rollout.engine`; harvested from the classes
  of agentrl/config/) as an argument, to the function or constructor it resolves to: a name defined in the same
  module, a name imported from an agentrl module (re-exports followed), `module.name` of an imported agentrl
  module, `Class.name` of an agentrl class (a classmethod), or `self.name` of the same class; a class means its
  `__init__` (a dataclass: entered, nothing to walk). In the callee the parameter that receives it carries it on
  (as does `x = config.section`); calls inside lambdas and nested functions count. Each (function, parameters
  carrying it) is walked once, each call counted once. A call from one file into another enters that file; its
  return comes back to the caller's file. Reported: files entered, cross-file calls, and the most returns to any
  one file (with that file). Calls on unknown objects (`worker.collect(...)`), methods of the config itself
  (`config.eval.due(step)`) and objects built from the config are not followed.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The layer of each top-level folder, lowest first: an arrow from a layer to a higher one is upward.
LAYERS = [
    # leaf utilities: errors, locks, plug-in loading, episodes and their metrics, MPI calls and node wake-ups, reward
    # functions; then the strict-model base of every typed section
    {"errors", "file_lock", "plugins", "trajectory", "metrics", "failures", "transport", "node_wakeup", "rewards"},
    {"sections"},
    {"models", "chat"},  # model files: loading, adapters, the chat template, tiny and value models; chat formats
    {"algorithms"},  # RL algorithms: their options are config sections, PPO's critic is a model
    {"config"},  # the typed config: validates `algorithm:` by the options class of the algorithm it names
    {"layout", "tracking"},  # ranks, roles and GPUs; experiment trackers
    # the parts: inference engines, envs, weight transports, task data, episode scores from judges and reward models
    {"engine", "env", "weights", "data", "scoring"},
    {"serve", "sft"},  # an OpenAI-compatible server over engines; SFT transcripts and data
    {"rollout", "trainer", "gateway", "policies"},  # the agent loop and worker, the policy step, the training gateway
    # (on serve), multi-agent games and their opponents
    {"evaluation", "run"},  # held-out evaluation; a run's life (start-up, folder, stops, liveness, summary)
    {"roles", "sweep"},  # each role's loop, built from all of the above; sweeps launch runs
    {"commands"},  # one module per subcommand
    {"cli", "__init__"},  # the parser and dispatch; the package's public names
]
# Where the top-level modules of the tree before the third wave's reshaping sit (so it measures old checkouts too):
FORMER = {"doorbell": 0, "logging": 5, "train": 11}
FORMER.update({name: 9 for name in ("startup", "liveness", "preempt", "supervise", "run_dir", "run_lock")})
FORMER.update({name: 9 for name in ("run_start", "run_summary")})
# Names modules define by contract: a command's entry points, and the plug-in registries' API (env, algorithm, chat)
INTERFACE_NAMES = {
    "main",
    "add_arguments",
    "add_parser",
    "__getattr__",
    "__dir__",
    "register",
    "resolve",
    "registered_names",
}
WALK_START = ("agentrl.commands.train", "train")  # before the reshaping: ("agentrl.train", "train")
LONG = 8


@dataclass
class Module:
    name: str
    path: Path
    tree: ast.Module
    is_package: bool
    imports: set[str] = field(default_factory=set)


def load_modules(package_dir: Path) -> dict[str, Module]:
    modules = {}
    base = package_dir.name
    for path in sorted(package_dir.rglob("*.py")):
        parts = path.relative_to(package_dir.parent).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_package else parts)
        tree = ast.parse(path.read_text(), str(path))
        modules[name] = Module(name, path, tree, is_package)
    assert base in modules, f"{package_dir} has no __init__.py"
    return modules


def absolute(module: Module, node: ast.ImportFrom) -> str:
    """The module an ImportFrom names, relative levels resolved."""
    if not node.level:
        return node.module or ""
    parts = module.name.split(".")
    if not module.is_package:
        parts = parts[:-1]
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def import_targets(module: Module, modules: dict[str, Module]) -> set[str]:
    found = set()
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules:
                    found.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            source = absolute(module, node)
            for alias in node.names:
                if f"{source}.{alias.name}" in modules:
                    found.add(f"{source}.{alias.name}")
                elif source in modules:
                    found.add(source)
    found.discard(module.name)
    return found


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components, iteratively; those of two or more nodes."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return components


def top_level(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def parameter_count(function: ast.FunctionDef | ast.AsyncFunctionDef, is_method: bool) -> int:
    arguments = function.args
    names = [a.arg for a in arguments.posonlyargs + arguments.args]
    if is_method and names and names[0] in ("self", "cls"):
        names = names[1:]
    return len(names) + len(arguments.kwonlyargs)


def functions(tree: ast.Module):
    """(qualified name, node, is_method) of every function and method, nested ones too."""

    def visit(body, prefix, in_class):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield f"{prefix}{node.name}", node, in_class
                yield from visit(node.body, f"{prefix}{node.name}.", False)
            elif isinstance(node, ast.ClassDef):
                yield from visit(node.body, f"{prefix}{node.name}.", True)

    yield from visit(tree.body, "", False)


# ---- the walk of `config` ----


def section_names(modules: dict[str, Module]) -> set[str]:
    """Attribute names of config sections: fields of agentrl.config's (and sft.config's) classes annotated with one
    of those classes (or an alias of them)."""
    holders = [m for name, m in modules.items() if name.startswith("agentrl.config") or name == "agentrl.sft.config"]
    classes = set()
    for module in holders:
        for node in module.tree.body:
            if isinstance(node, ast.ClassDef):
                classes.add(node.name)
            elif isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets):
                classes.update(t.id for t in node.targets if t.id.endswith("Config"))
    names = set()
    for module in holders:
        for node in ast.walk(module.tree):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        mentioned = {n.id for n in ast.walk(item.annotation) if isinstance(n, ast.Name)}
                        if mentioned & classes:
                            names.add(item.target.id)
    return names


class Walk:
    def __init__(self, modules: dict[str, Module]):
        self.modules = modules
        self.sections = section_names(modules)
        self.defs: dict[str, dict[str, ast.AST]] = {}  # module -> top-level name -> def/class
        self.imported: dict[str, dict[str, tuple[str, str | None]]] = {}  # module -> local name -> (module, attr)
        for name, module in modules.items():
            self.defs[name] = {
                node.name: node
                for node in module.tree.body
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            }
            local: dict[str, tuple[str, str | None]] = {}
            for node in ast.walk(module.tree):
                if isinstance(node, ast.ImportFrom):
                    source = absolute(module, node)
                    for alias in node.names:
                        as_name = alias.asname or alias.name
                        if f"{source}.{alias.name}" in modules:
                            local[as_name] = (f"{source}.{alias.name}", None)
                        elif source in modules:
                            local[as_name] = (source, alias.name)
                elif isinstance(node, ast.Import):
                    for alias in node.names:
                        if alias.name in modules and alias.asname:
                            local[alias.asname] = (alias.name, None)
            self.imported[name] = local
        self.seen: set[tuple[str, str, frozenset]] = set()
        self.counted: set[tuple[str, int, int]] = set()  # call sites already counted
        self.entered: set[str] = set()
        self.returns: Counter = Counter()
        self.cross_calls = 0

    def resolve_name(self, module: str, name: str, depth: int = 0):
        """(module, def node) that `name` means in `module`, following re-exports; None if not agentrl code."""
        if depth > 8:
            return None
        if name in self.defs[module]:
            return module, self.defs[module][name]
        source = self.imported[module].get(name)
        if source is None or source[1] is None:
            return None
        return self.resolve_name(source[0], source[1], depth + 1)

    def resolve_call(self, module: str, cls: ast.ClassDef | None, func: ast.expr):
        if isinstance(func, ast.Name):
            return self.resolve_name(module, func.id)
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            owner = func.value.id
            if owner == "self" and cls is not None:
                for item in cls.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == func.attr:
                        return module, item
                return None
            source = self.imported[module].get(owner)
            if source is not None and source[1] is None:  # `module.name`, re-exports followed
                return self.resolve_name(source[0], func.attr)
            found = self.resolve_name(module, owner)  # `Class.method(...)`: a classmethod of an agentrl class
            if found is not None and isinstance(found[1], ast.ClassDef):
                for item in found[1].body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == func.attr:
                        return found[0], item
        return None

    def carries(self, node: ast.expr, tracked: set[str]) -> bool:
        """`config` itself, or an attribute chain of section names from a tracked name."""
        while isinstance(node, ast.Attribute):
            if node.attr not in self.sections:
                return False
            node = node.value
        return isinstance(node, ast.Name) and node.id in tracked

    def walk(self, module: str, function, cls: ast.ClassDef | None, tracked: set[str]) -> None:
        key = (module, f"{getattr(cls, 'name', '')}.{function.name}", frozenset(tracked))
        if key in self.seen:
            return
        self.seen.add(key)
        tracked = set(tracked)
        for node in ast.walk(function):  # assignments first, so `x = config.rollout` carries it in x
            single = isinstance(node, ast.Assign) and len(node.targets) == 1
            if single and isinstance(node.targets[0], ast.Name) and self.carries(node.value, tracked):
                tracked.add(node.targets[0].id)
        for node in ast.walk(function):
            if not isinstance(node, ast.Call):
                continue
            positions = [i for i, arg in enumerate(node.args) if self.carries(arg, tracked)]
            keywords = [kw.arg for kw in node.keywords if kw.arg and self.carries(kw.value, tracked)]
            if not positions and not keywords:
                continue
            target = self.resolve_call(module, cls, node.func)
            if target is None:
                continue
            target_module, definition = target
            target_cls = cls if target_module == module and definition in (cls.body if cls else []) else None
            if isinstance(definition, ast.ClassDef):
                target_cls = definition
                definition = next(
                    (i for i in definition.body if isinstance(i, ast.FunctionDef) and i.name == "__init__"), None
                )
            params = []
            if definition is not None:
                arguments = definition.args
                params = [a.arg for a in arguments.posonlyargs + arguments.args]
                if target_cls is not None and params and params[0] in ("self", "cls"):
                    params = params[1:]
            received = {params[i] for i in positions if i < len(params)} | set(keywords)
            site = (module, node.lineno, node.col_offset)
            if target_module != module and site not in self.counted:
                self.counted.add(site)
                self.entered.add(target_module)
                self.cross_calls += 1
                self.returns[self.modules[module].path] += 1
            if definition is not None and received:
                self.walk(target_module, definition, target_cls, received)


def config_walk(modules: dict[str, Module], start: tuple[str, str]):
    walk = Walk(modules)
    module, name = start
    if module not in modules:
        module = "agentrl.train"  # before the reshaping
    definition = walk.defs[module][name]
    walk.walk(module, definition, None, {"config"})
    return walk


def relative(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=str(ROOT / "agentrl"), help="the package folder (default agentrl/)")
    parser.add_argument("--list", action="store_true", help="also list each finding")
    args = parser.parse_args()
    package_dir = Path(args.root).resolve()
    modules = load_modules(package_dir)
    graph = {name: import_targets(module, modules) for name, module in modules.items()}

    circles = strongly_connected(graph)
    folder_arrows: dict[tuple[str, str], list[str]] = defaultdict(list)
    for source, targets in graph.items():
        for target in targets:
            a, b = top_level(source), top_level(target)
            if a != b:
                folder_arrows[a, b].append(f"{source} -> {target}")
    ties = sorted({tuple(sorted(pair)) for pair in folder_arrows if pair[::-1] in folder_arrows})
    layer = {**FORMER, **{name: i for i, names in enumerate(LAYERS) for name in names}}
    folders = sorted({top_level(name) for name in modules})
    unplaced = [name for name in folders if name not in layer]
    upward = sorted(
        (pair, arrows)
        for pair, arrows in folder_arrows.items()
        if pair[0] in layer and pair[1] in layer and layer[pair[0]] < layer[pair[1]]
    )

    long_lists = []
    defined = defaultdict(list)
    for module in modules.values():
        for qualname, node, is_method in functions(module.tree):
            count = parameter_count(node, is_method)
            if count > LONG:
                long_lists.append((count, f"{relative(module.path)}:{node.lineno} {qualname}"))
        for node in module.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name not in INTERFACE_NAMES:
                defined[node.name].append(relative(module.path))
    duplicates = {name: paths for name, paths in defined.items() if len(paths) > 1}
    top_files = sorted(p.name for p in package_dir.glob("*.py"))
    walk = config_walk(modules, WALK_START)
    most_file, most = walk.returns.most_common(1)[0] if walk.returns else (None, 0)
    start = WALK_START if WALK_START[0] in modules else ("agentrl.train", WALK_START[1])

    rows = [
        ("modules", len(modules)),
        ("import arrows (module -> module)", sum(len(t) for t in graph.values())),
        ("files directly under agentrl/", len(top_files)),
        ("top-level folders", len(folders)),
        ("import circles (modules in them)", f"{len(circles)} ({sum(len(c) for c in circles)})"),
        ("two-way ties between top-level folders", len(ties)),
        ("upward arrows (folder pairs)", len(upward)),
        ("unplaced top-level folders", len(unplaced)),
        (f"functions with more than {LONG} parameters", len(long_lists)),
        ("helper names defined more than once", len(duplicates)),
        (f"walk of config from {start[0]}.{start[1]}: files entered", len(walk.entered)),
        ("  calls into another file", walk.cross_calls),
        ("  most returns to one file", f"{most} ({relative(most_file) if most_file else '-'})"),
    ]
    width = max(len(label) for label, _ in rows)
    print(f"{'measure':<{width}}  value")
    for label, value in rows:
        print(f"{label:<{width}}  {value}")
    if args.list:
        print("\nfiles directly under agentrl/:", " ".join(top_files))
        for component in circles:
            print("circle:", " <-> ".join(component))
        for a, b in ties:
            print(f"tie: {a} <-> {b}: {folder_arrows[a, b][0]}; {folder_arrows[b, a][0]}")
        for (a, b), arrows in upward:
            print(f"upward: {a} -> {b}: {'; '.join(sorted(arrows))}")
        for name in unplaced:
            print("unplaced:", name)
        for count, where in sorted(long_lists, reverse=True):
            print(f"{count} parameters: {where}")
        for name, paths in sorted(duplicates.items()):
            print(f"defined {len(paths)} times: {name}: {', '.join(paths)}")
        for path, count in walk.returns.most_common():
            print(f"returns to {relative(path)}: {count}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
