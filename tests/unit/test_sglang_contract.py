"""Every SGLang call agentrl makes exists and takes the keywords we pass (agentrl.engine.sglang.SGLANG_CALLS).

With SGLang installed the check uses inspect on the real objects; otherwise, when
AGENTRL_SGLANG_SRC points at an unpacked SGLang tree (the `sglang` folder of a wheel or
of python/ in a checkout), it reads the source with ast; otherwise it skips.
"""

import ast
import asyncio
import importlib
import importlib.util
import inspect
import os
import signal
import sys
from pathlib import Path

import pytest

from agentrl.engine.sglang import MISSING_SGLANG, SGLANG_CALLS, SGLangCall, SGLangMissingError

RUNTIME_MODULES = {"ServerArgs": "sglang.srt.server_args"}  # assembled from srt/arg_groups/fields at import


def _source_root() -> Path | None:
    given = os.environ.get("AGENTRL_SGLANG_SRC")
    if not given:
        return None
    root = Path(given)
    return root / "sglang" if (root / "sglang" / "srt").is_dir() else root


def _runtime_accepted(call: SGLangCall) -> set[str] | None:
    """Accepted keyword names from the installed package; None when it takes **kwargs."""
    module = RUNTIME_MODULES.get(call.owner) or "sglang." + call.source.removesuffix(".py").replace("/", ".")
    owner = getattr(importlib.import_module(module), call.owner)
    if call.function == "fields":
        names = set(inspect.signature(owner).parameters) | set(getattr(owner, "__struct_fields__", ()))
        return names | set(getattr(owner, "__dataclass_fields__", {}))
    parameters = inspect.signature(getattr(owner, call.function)).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return {p.name for p in parameters}


def _classes(path: Path, name: str | None) -> list[ast.ClassDef]:
    files = sorted(path.glob("*.py")) if path.is_dir() else [path]
    return [
        node
        for file in files
        for node in ast.walk(ast.parse(file.read_text()))
        if isinstance(node, ast.ClassDef) and (name is None or node.name == name)
    ]


def _static_accepted(root: Path, call: SGLangCall) -> set[str] | None:
    path = root / call.source
    assert path.exists(), f"{call.source} is not in the SGLang source at {root}"
    if call.function == "fields":
        owners = _classes(path, None if path.is_dir() else call.owner)
        assert owners, f"no class {call.owner} in {call.source}"
        return {
            stmt.target.id
            for owner in owners
            for stmt in owner.body
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
        }
    (owner,) = _classes(path, call.owner)
    functions = [
        n for n in owner.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == call.function
    ]
    assert functions, f"{call.owner}.{call.function} is not defined in {call.source}"
    args = functions[0].args
    if args.kwarg is not None:
        return None
    return {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}


def _accepted_keywords():
    if importlib.util.find_spec("sglang") is not None:
        return "installed sglang", _runtime_accepted
    root = _source_root()
    if root is not None:
        return f"source at {root}", lambda call: _static_accepted(root, call)
    pytest.skip("SGLang is not installed and AGENTRL_SGLANG_SRC is unset; unpack an SGLang wheel and point it there")


@pytest.mark.parametrize("call", SGLANG_CALLS, ids=lambda c: f"{c.owner}.{c.function}")
def test_sglang_call_takes_our_keywords(call):
    where, accepted_keywords = _accepted_keywords()
    accepted = accepted_keywords(call)
    if accepted is None:
        return  # takes **kwargs: any keyword is accepted
    missing = [keyword for keyword in call.keywords if keyword not in accepted]
    assert not missing, f"{call.owner}.{call.function} in {where} does not take {missing}"


def test_sglang_backend_without_sglang_says_how_to_install(monkeypatch):
    from agentrl.config import load_config
    from agentrl.engine import make_engine

    monkeypatch.setitem(sys.modules, "sglang", None)  # import sglang now raises ImportError
    config = load_config(None, ["model.path=/nonexistent", "rollout.engine.backend=sglang"])
    with pytest.raises(SGLangMissingError, match=r"pip install 'agentrl\[sglang\]'") as raised:
        make_engine(config.rollout.engine, config.model, "cuda:0", seed=0, colocate=config.layout.colocate)
    assert isinstance(raised.value, ImportError) and str(raised.value) == MISSING_SGLANG


# ---- the pure conversions, and SGLangEngine against a stand-in for sglang.Engine -------------


def test_stop_token_kept_even_when_sglang_trims_it_from_output_ids():
    from agentrl.engine.sglang import to_generate_output

    entries = [(-0.5, 11, None), (-1.25, 12, None), (-0.125, 2, None)]  # 2 is the stop token
    trimmed = {
        "output_ids": [11, 12],
        "meta_info": {"finish_reason": {"type": "stop", "matched": 2}, "output_token_logprobs": entries},
    }
    kept = {**trimmed, "output_ids": [11, 12, 2]}
    for result in (trimmed, kept):
        out = to_generate_output(result, weight_version=4)
        assert out.output_ids.tolist() == [11, 12, 2] and out.finish_reason == "stop" and out.weight_version == 4
        assert out.logprobs.tolist() == [-0.5, -1.25, -0.125]


def test_disagreeing_ids_and_logprobs_are_an_error():
    from agentrl.engine.sglang import to_generate_output

    result = {
        "output_ids": [5, 6],
        "meta_info": {"finish_reason": {"type": "length"}, "output_token_logprobs": [(-1.0, 5, None)]},
    }
    with pytest.raises(ValueError, match="disagree"):
        to_generate_output(result, 0)


def test_sampling_params_map_top_k_and_keep_the_stop_token():
    from agentrl.engine.base import SamplingParams
    from agentrl.engine.sglang import sampling_params_for_sglang

    params = sampling_params_for_sglang(SamplingParams(max_new_tokens=9, top_k=0, stop_token_ids=(2, 3), seed=7))
    assert params["top_k"] == -1 and params["stop_token_ids"] == [2, 3] and params["no_stop_trim"] is True
    assert params["sampling_seed"] == 7 and params["max_new_tokens"] == 9
    assert sampling_params_for_sglang(SamplingParams(max_new_tokens=1, top_k=20))["top_k"] == 20


def test_children_do_not_see_the_mpi_environment(monkeypatch):
    from agentrl.engine.sglang import NO_MPI_FLAG, environment_without_mpi

    monkeypatch.setenv("PMI_RANK", "3")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    monkeypatch.setenv("HOME_IS_KEPT", "1")
    with environment_without_mpi():
        seen = os.environ.copy()
    assert "PMI_RANK" not in seen and "OMPI_COMM_WORLD_SIZE" not in seen and seen[NO_MPI_FLAG] == "1"
    assert seen["HOME_IS_KEPT"] == "1"
    assert os.environ["PMI_RANK"] == "3" and os.environ["OMPI_COMM_WORLD_SIZE"] == "4" and NO_MPI_FLAG not in os.environ


class _FakeTokenizerManager:
    def __init__(self):
        self.event_loop = None
        self.aborted = []

    def auto_create_handle_loop(self):  # as SGLang's: the running loop, else a new one; loop signal handlers
        try:
            self.event_loop = asyncio.get_running_loop()
        except RuntimeError:
            self.event_loop = asyncio.new_event_loop()
        self.event_loop.add_signal_handler(signal.SIGTERM, lambda: None)
        self.event_loop.add_signal_handler(signal.SIGQUIT, lambda: None)

    def abort_request(self, rid="", abort_all=False):
        self.aborted.append(abort_all)


class _FakeSGLangEngine:
    """What SGLangEngine relies on from sglang.Engine: its own loop, blocking weight calls on that loop."""

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.environ_at_start = dict(os.environ)
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        self.tokenizer_manager = _FakeTokenizerManager()
        self.calls = []

    async def async_generate(self, input_ids, sampling_params, return_logprob):
        assert asyncio.get_running_loop() is self.loop and return_logprob
        generated = [len(input_ids), 2]  # 2 stops the turn; SGLang may trim it from output_ids
        entries = [(-0.25, token, None) for token in generated]
        meta = {"finish_reason": {"type": "stop", "matched": 2}, "output_token_logprobs": entries}
        return {"output_ids": generated[:-1], "meta_info": meta}

    def _blocking(self, name, result=None):
        assert not self.loop.is_running(), f"{name} runs loop.run_until_complete: the loop must be idle"
        self.calls.append(name)
        return result

    def begin_weight_update(self):
        return self._blocking("begin")

    def update_weights_from_tensor(self, named_tensors, flush_cache):
        return self._blocking("tensor", (True, "ok"))

    def end_weight_update(self):
        return self._blocking("end")

    def flush_cache(self):
        return self._blocking("flush")

    def release_memory_occupation(self):
        return self._blocking("release")

    def resume_memory_occupation(self):
        return self._blocking("resume")


def test_sglang_engine_drives_the_engine_on_its_own_loop(monkeypatch):
    import types

    from agentrl.config import SGLangEngineConfig
    from agentrl.engine.base import SamplingParams
    from agentrl.engine.sglang import SGLangEngine, abort_job_on_child_crash

    monkeypatch.setitem(sys.modules, "sglang", types.SimpleNamespace(Engine=_FakeSGLangEngine))
    monkeypatch.setenv("PMI_RANK", "1")
    from agentrl.run import preempt

    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGQUIT, *preempt.STOP_SIGNALS)}
    try:
        section = SGLangEngineConfig(tp_size=2)
        engine = SGLangEngine("/models/m", section, base_gpu_id=3, colocate=True, seed=5, dtype="bfloat16")
        assert signal.getsignal(signal.SIGQUIT) is abort_job_on_child_crash
        assert signal.getsignal(signal.SIGTERM) is preempt._flag  # not SGLang's drain-and-exit
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    fake = engine.engine
    assert fake.kwargs["base_gpu_id"] == 3 and fake.kwargs["tp_size"] == 2 and fake.kwargs["skip_tokenizer_init"]
    assert fake.kwargs["enable_memory_saver"] and fake.kwargs["random_seed"] == 5
    assert "PMI_RANK" not in fake.environ_at_start and os.environ["PMI_RANK"] == "1"
    assert engine.weight_group_size == 2 and engine.event_loop is fake.loop

    sampling = SamplingParams(max_new_tokens=4, stop_token_ids=(2,))

    async def two_requests():
        return await asyncio.gather(engine.generate([1, 2, 3], sampling), engine.generate([1], sampling))

    outputs = engine.event_loop.run_until_complete(two_requests())
    assert [o.output_ids.tolist() for o in outputs] == [[3, 2], [1, 2]]
    assert all(o.finish_reason == "stop" for o in outputs) and engine.busy_seconds > 0
    with pytest.raises(RuntimeError, match=r"engine\.event_loop"):
        asyncio.run(engine.generate([1], sampling))

    engine.load_weights([("w", None)], version=6)
    assert fake.calls == ["begin", "tensor", "end", "flush"] and engine.weight_version == 6
    engine.sleep()
    engine.sleep()
    engine.wake()
    assert fake.calls[4:] == ["release", "resume"]
    engine.abort_all()
    assert fake.tokenizer_manager.aborted == [True]
    fake.loop.close()


def test_agentrl_no_mpi_keeps_spawned_children_out_of_mpi():
    import os
    import subprocess
    import sys

    code = "import agentrl; from mpi4py import MPI; print(MPI.Is_initialized())"
    for flag, expected in (("1", "False"), ("", "True")):
        environment = {**os.environ, "AGENTRL_NO_MPI": flag}
        out = subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True, timeout=60)
        assert out.stdout.strip() == expected, out.stderr
