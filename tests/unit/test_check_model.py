"""`agentrl check-model PATH`: the family, the template, the markers, the probe, a conversation parsed back; a folder
it cannot read gets one line saying what to do."""

import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.models.families import build_family_model

REPO = Path(__file__).resolve().parents[2]


def check_model(*arguments, timeout=120):
    command = [sys.executable, "-m", "agentrl.cli", "check-model", *arguments]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=REPO)


@pytest.fixture(scope="module")
def family_folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("check_model")
    return {family: build_family_model(family, root / family) for family in ("hermes", "qwen3", "deepseek_r1")}


def test_a_family_model_is_detected_probed_and_parsed_back(family_folders):
    result = check_model(str(family_folders["qwen3"]))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "chat format     qwen3 (detected)" in out
    assert "<think>" in out and "<tool_call>" in out and "<|im_end|>" in out
    assert "no   append-only after a user message" in out  # Qwen3 drops earlier reasoning
    assert "append-only     no: a rewritten history starts a new sample" in out
    assert "turn 2 parsed back: content='' reasoning='Add them.' calls=[('agentrl_add', {'a': 2, 'b': 3})]" in out
    assert out.rstrip().endswith("ok")


def test_an_append_only_family_says_so(family_folders):
    result = check_model(str(family_folders["hermes"]))
    assert result.returncode == 0, result.stderr
    assert "append-only     yes" in result.stdout


def test_a_turn_the_template_does_not_write_after_its_own_prompt_is_named(family_folders):
    result = check_model(str(family_folders["deepseek_r1"]))
    assert result.returncode == 0, result.stderr
    assert "turn 2: not parsed back here: turn 2 is not written after its own generation prompt" in result.stdout


def test_naming_a_format_overrides_detection_and_an_unknown_one_lists_the_known(family_folders):
    named = check_model(str(family_folders["qwen3"]), "--chat-format", "hermes")
    assert "chat format     hermes (named with --chat-format)" in named.stdout
    unknown = check_model(str(family_folders["qwen3"]), "--chat-format", "nope")
    assert unknown.returncode == 2
    assert "nope" in unknown.stderr and "qwen3" in unknown.stderr and unknown.stderr.count("\n") == 1


def test_a_folder_without_a_chat_template_gets_one_line_naming_the_fix(family_folders, tmp_path):
    import shutil

    bare = tmp_path / "bare"
    shutil.copytree(family_folders["hermes"], bare)
    (bare / "chat_template.jinja").unlink(missing_ok=True)
    config = bare / "tokenizer_config.json"
    import json

    settings = json.loads(config.read_text())
    settings.pop("chat_template", None)
    config.write_text(json.dumps(settings))
    result = check_model(str(bare))
    assert result.returncode == 2
    assert result.stderr.startswith("agentrl: ") and result.stderr.count("\n") == 1
    assert "chat.format" in result.stderr or "chat template" in result.stderr


def test_list_names_every_registered_family():
    result = check_model(".", "--list")
    assert result.returncode == 0
    assert {"hermes", "qwen3", "llama3", "mistral", "harmony", "deepseek_v3", "deepseek_r1", "glm45"} <= set(
        result.stdout.split()
    )
