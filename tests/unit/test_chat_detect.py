"""The family of a model folder is detected from its tokenizer and config, `format` overrides it, bad folders and
names get one-line errors saying what to do, and a pip-installed package adds a family by entry point."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.chat.codec import ChatTemplateError, load_codec
from agentrl.chat.detect import UnknownChatFormat, detect_family
from agentrl.chat.family import ModelSignals
from agentrl.chat.qwen3 import Qwen3Family
from agentrl.chat.registry import register, registered_names, resolve
from agentrl.models.families import FIXTURES, tiny_config
from tests.unit.chat_fixtures import FAMILIES, tokenizer

PLUGIN = Path(__file__).resolve().parents[1] / "plugins" / "pipe_chat"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """A model folder per family: its tokenizer and a config.json of its architecture (no weights needed)."""
    root = tmp_path_factory.mktemp("family_folders")
    made = {}
    for family in FAMILIES:
        folder = root / family
        tokenizer(family).save_pretrained(folder)
        tiny_config(family, len(tokenizer(family))).save_pretrained(folder)
        made[family] = folder
    return made


@pytest.mark.parametrize("family", FAMILIES)
def test_the_family_of_a_model_folder_is_detected(folders, family):
    chat = load_codec(folders[family])
    assert chat.family.name == family
    assert json.loads((folders[family] / "config.json").read_text())["model_type"] == FIXTURES[family].architecture


def test_agentrls_own_tiny_model_is_hermes(tiny_model_dir):
    chat = load_codec(tiny_model_dir)
    assert chat.family.name == "hermes"
    ids = chat.tokenizer.convert_tokens_to_ids
    assert chat.stop_ids == (ids("<|im_end|>"), ids("<|endoftext|>"))  # as Qwen2.5's generation config stops


def test_the_format_named_overrides_detection(folders):
    assert load_codec(folders["hermes"], format="qwen3").family.name == "qwen3"
    with pytest.raises(ChatTemplateError, match=r"none of the llama3 end-of-turn tokens .*set chat.format"):
        load_codec(folders["hermes"], format="llama3")


def test_a_folder_without_a_chat_template_is_refused(folders, tmp_path):
    shutil.copytree(folders["llama3"], tmp_path / "m")
    config = json.loads((tmp_path / "m" / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (tmp_path / "m" / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "m" / "chat_template.jinja").unlink(missing_ok=True)
    with pytest.raises(ChatTemplateError, match="no chat template; use an instruct/chat model"):
        load_codec(tmp_path / "m")


def test_a_model_no_family_recognises_says_how_to_name_or_register_one():
    signals = ModelSignals(frozenset({"<s>", "</s>"}), "{% for m in messages %}{{ m.content }}{% endfor %}", "gpt2")
    with pytest.raises(UnknownChatFormat, match=r"set chat.format to one of .*hermes.*'agentrl.chat_formats'"):
        detect_family(signals)


def test_two_families_that_fit_equally_are_an_error_asking_for_a_name():
    signals = ModelSignals(frozenset({"<|im_start|>", "<think>"}), "", "qwen3")
    assert detect_family(signals) == "qwen3"

    class Twin(Qwen3Family):
        name = "twin"

    with pytest.raises(UnknownChatFormat, match=r"ambiguous: qwen3, twin fit it equally; set chat.format"):
        detect_family(signals, families={"qwen3": Qwen3Family, "twin": Twin})


def test_an_unknown_format_name_lists_the_known_ones():
    with pytest.raises(KeyError, match=r"unknown chat format 'qwen4'.*did you mean 'qwen3'.*known: .*glm45"):
        resolve("qwen4")


def test_a_family_registered_in_process_or_by_path_resolves():
    class Mine(Qwen3Family):
        name = "mine"

        @classmethod
        def detect(cls, signals):
            return 0  # named only: registered for the rest of the session, it must not tie with qwen3

    register("agentrl_test_mine", Mine)
    assert resolve("agentrl_test_mine") is Mine
    assert resolve("agentrl.chat.qwen3:Qwen3Family") is Qwen3Family
    assert "agentrl_test_mine" in registered_names()
    with pytest.raises(TypeError, match=r"not a subclass of agentrl\.chat\.family\.ChatFamily"):
        resolve("agentrl.chat.turn:ToolCall")


@pytest.fixture(scope="module")
def plugin_environment(tmp_path_factory):
    root = tmp_path_factory.mktemp("chat_plugin")
    source, site = root / "source", root / "site"
    shutil.copytree(PLUGIN, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--target"]
    subprocess.run([*pip, str(site), str(source)], check=True, capture_output=True, timeout=120)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)]), "OMP_NUM_THREADS": "1"}


def test_a_pip_installed_family_is_found_by_entry_point_detected_and_parses(plugin_environment):
    script = """
from agentrl.chat.detect import detect_family
from agentrl.chat.family import ModelSignals
from agentrl.chat.registry import registered_names, resolve
assert "pipe" in registered_names(), registered_names()
assert detect_family(ModelSignals(frozenset({"<|done|>"}))) == "pipe"
turn = resolve("pipe")().parse('Sure. ||add {"a": 2, "b": 3}||')
print(turn.content, turn.calls[0].name, turn.calls[0].arguments)
"""
    result = subprocess.run(
        [sys.executable, "-c", script], env=plugin_environment, capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "Sure. add {'a': 2, 'b': 3}"
