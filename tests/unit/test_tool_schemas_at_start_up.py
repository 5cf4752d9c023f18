"""A tool schema the model's chat template cannot render: refused at start-up in one line naming the tool, the
family and the fix (through `agentrl train`, before any rank trains), and in serve / the gateway a request with
such a tool gets a 400 naming it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Literal

import pytest

from agentrl.chat.tool_schemas import unrendered_tool
from agentrl.env.tools import ToolEnv, tool
from agentrl.models.families import build_family_model, chat_template
from tests.unit.chat_fixtures import CORPUS

ROOT = Path(__file__).resolve().parents[2]
MODULE = "tests.unit.test_tool_schemas_at_start_up"  # as `agentrl train` imports it from the repository root
ENV_ID = f"{MODULE}:UnitsEnv"
# A template that needs every parameter's JSON type (as some published ones do: they print `type` per argument), so
# a Literal's schema ({"enum": [...]}, no "type") makes it raise.
NEEDS_TYPES = (
    "{%- for tool in tools or [] -%}{%- for name, spec in tool.function.parameters.properties.items() -%}"
    "{%- if spec.type is not defined -%}"
    '{{- raise_exception("parameter " ~ name ~ " of " ~ tool.function.name ~ " has no type") -}}'
    "{%- endif -%}{%- endfor -%}{%- endfor -%}"
)
# A template that lists only the tools that have a description: an undocumented tool never reaches the model.
LISTS = "{%- for tool in tools -%}"
DESCRIBED_ONLY = "{%- for tool in tools if tool.function.description -%}"


class UnitsEnv(ToolEnv):
    @tool
    def convert(self, value: float, unit: Literal["c", "f"]) -> str:
        """Convert a temperature.

        Args:
            value: the temperature
            unit: the unit to convert to
        """
        return str(value * 9 / 5 + 32 if unit == "f" else (value - 32) * 5 / 9)

    @tool
    def add(self, a: int, b: int) -> str:
        """Add two integers.

        Args:
            a: the first addend
            b: the second addend
        """
        return str(a + b)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        return "What is 20 C in F?", {}

    def answer(self, text):
        return "done", float("68" in text), True, False, {}


def echo(text: str) -> str:  # no docstring: a tool without a description
    return text


class UndocumentedEnv(UnitsEnv):
    def __init__(self):
        super().__init__()
        self.add_tool(echo)


def qwen3_model(folder: Path, template: str) -> Path:
    """A tiny Qwen3 model folder whose chat template is `template`."""
    from transformers import AutoTokenizer

    build_family_model("qwen3", folder, CORPUS)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = template
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def needs_types(tmp_path_factory) -> Path:
    return qwen3_model(tmp_path_factory.mktemp("needs_types") / "model", NEEDS_TYPES + chat_template("qwen3"))


def test_agentrl_train_refuses_a_tool_schema_the_template_cannot_render_before_training(needs_types, tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(
        f"run_dir: {tmp_path / 'run'}\nsteps: 2\nmodel: {{path: {needs_types}}}\nenv: {{id: '{ENV_ID}'}}\n"
        "rollout: {tasks_per_step: 2, group_size: 2, max_turns: 2, max_new_tokens: 8, max_episode_tokens: 512}\n"
        "trainer: {micro_batch_size: 4}\ncheckpoint: {every: 0}\nlogging: {progress: false}\n"
    )
    run = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "train", str(config)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 2, output[-3000:]
    (line,) = [line for line in output.splitlines() if "tool 'convert'" in line]
    assert f"env.id='{ENV_ID}': tool 'convert' cannot go into the prompt: the qwen3 chat template raised" in line
    assert "parameter unit of convert has no type" in line and "Change that tool's JSON schema" in line
    assert "model.path" in line and "add" not in line.split("raised on it")[1].split(")")[0]
    assert not (tmp_path / "run" / "tb").exists() and not (tmp_path / "run" / "checkpoints").exists()


def test_a_tool_the_template_leaves_out_is_named_and_tools_it_renders_pass(tmp_path):
    from agentrl.config import load_config
    from agentrl.run.preflight import ChatFormatUnusable, check_chat_format

    drops = qwen3_model(tmp_path / "drops", chat_template("qwen3").replace(LISTS, DESCRIBED_ONLY, 1))
    quiet = lambda *a, **k: None  # noqa: E731
    with pytest.raises(ChatFormatUnusable) as refused:
        check_chat_format(load_config(None, [f"model.path={drops}", f"env.id={MODULE}:UndocumentedEnv"]), quiet)
    message = str(refused.value)
    assert "\n" not in message and "tool 'echo'" in message, message
    assert "the qwen3 chat template leaves it out (its name is not in the prompt)" in message
    assert check_chat_format(load_config(None, [f"model.path={drops}", f"env.id={ENV_ID}"]), quiet) == "qwen3"


def test_unrendered_tool_blames_no_tool_for_messages_the_template_refuses(needs_types):
    from agentrl.chat.codec import load_codec

    codec = load_codec(needs_types)
    tools = UnitsEnv().tools
    assert unrendered_tool(codec, [t for t in tools if t["function"]["name"] == "add"]) is None  # typed parameters
    assert unrendered_tool(codec, tools).name == "convert"
    two_systems = [{"role": "user", "content": "u"}, {"role": "system", "content": "late"}]
    codec.tokenizer.chat_template = '{{- raise_exception("system first") if messages[-1].role == "system" -}}x'
    assert unrendered_tool(codec, tools, two_systems) is None  # the messages' fault, not a tool's


def test_serve_answers_a_request_with_an_unrenderable_tool_with_a_400_naming_it(needs_types):
    openai = pytest.importorskip("openai")
    from agentrl.models.loading import load_tokenizer
    from agentrl.serve.app import build_app
    from agentrl.serve.completions import Completions
    from agentrl.serve.generation import LocalBackend
    from tests.unit.serve_server import ThreadServer
    from tests.unit.test_serve_families import ScriptedEngine

    tokenizer = load_tokenizer(str(needs_types))
    engine = ScriptedEngine()
    app = build_app(Completions(LocalBackend(engine, tokenizer), tokenizer, "m", 2048))
    with ThreadServer(app) as server:
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "20 C?"}], tools=UnitsEnv().tools
            )
    error = refused.value.body
    assert error["param"] == "tools" and "tool 'convert'" in error["message"] and "qwen3" in error["message"], error
    assert engine.prompts == []  # nothing generated
