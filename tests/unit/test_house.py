"""benchmarks/house.py on a small package written here: each count it reports, on a case where it must find one."""

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import house  # noqa: E402

FILES = {
    "__init__.py": "",
    "errors.py": "def helper():\n    from agentrl.engine import run  # a leaf reaching up into the parts\n",
    "config/__init__.py": "",
    "config/schema.py": """
        class RolloutConfig:
            steps: int


        class Config:
            rollout: RolloutConfig
            seed: int
    """,
    "engine/__init__.py": "from agentrl.engine.a import run\n",
    "engine/a.py": """
        from agentrl.engine.b import step


        def run(rollout, seed):
            return step(rollout)
    """,
    "engine/b.py": """
        def step(rollout):
            from agentrl.engine.a import run  # a circle with a.py

            return run
    """,
    "env/__init__.py": "",
    "env/host.py": "from agentrl.weights.base import sync\n",
    "env/api.py": "",
    "weights/__init__.py": "from agentrl.env import api  # env and weights import each other: a tie, not a circle\n",
    "weights/base.py": "def sync():\n    pass\n",
    "commands/__init__.py": "",
    "commands/train.py": """
        from agentrl import engine
        from agentrl.engine.a import run
        from agentrl.errors import helper


        def train(config):
            rollout = config.rollout
            run(rollout, config.seed)  # a field is not a section: only `rollout` travels
            engine.run(config.rollout, 0)
            helper()  # no config: not followed
            return wide(1, 2, 3, 4, 5, 6, 7, 8, 9)


        def wide(a, b, c, d, e, f, g, h, i):
            return a


        def helper():
            pass
    """,
}


def make_package(tmp_path: Path) -> Path:
    root = tmp_path / "agentrl"
    for name, text in FILES.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
    return root


def test_the_import_graph_finds_circles_ties_and_upward_arrows(tmp_path):
    modules = house.load_modules(make_package(tmp_path))
    graph = {name: house.import_targets(module, modules) for name, module in modules.items()}
    assert house.strongly_connected(graph) == [["agentrl.engine.a", "agentrl.engine.b"]]
    assert "agentrl.engine.a" in graph["agentrl.commands.train"]  # function-level imports count too
    assert "agentrl.engine" in graph["agentrl.errors"]


def test_the_walk_follows_config_and_its_sections_across_files(tmp_path):
    modules = house.load_modules(make_package(tmp_path))
    walk = house.config_walk(modules, ("agentrl.commands.train", "train"))
    assert walk.entered == {"agentrl.engine.a", "agentrl.engine.b"}  # not errors: helper() takes no config
    train_file = modules["agentrl.commands.train"].path
    assert walk.returns[train_file] == 2  # run(rollout, ...) and engine.run(config.rollout, ...), each once
    assert walk.returns[modules["agentrl.engine.a"].path] == 1  # step(rollout) into b.py


def test_the_table_counts_what_the_package_holds(tmp_path):
    root = make_package(tmp_path)
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "house.py"), "--root", str(root), "--list"],
        capture_output=True,
        text=True,
        check=True,
    )
    rows = dict(line.rsplit("  ", 1) for line in result.stdout.splitlines()[1:14])
    counts = {label.strip(): value.strip() for label, value in rows.items()}
    assert counts["files directly under agentrl/"] == "2"
    assert counts["import circles (modules in them)"] == "1 (2)"
    assert counts["two-way ties between top-level folders"] == "1"
    assert counts["upward arrows (folder pairs)"] == "1"  # errors -> engine; env <-> weights share a layer
    assert counts["functions with more than 8 parameters"] == "1"
    assert counts["helper names defined more than once"] == "1"  # helper: errors.py and commands/train.py
    assert "upward: errors -> engine" in result.stdout
