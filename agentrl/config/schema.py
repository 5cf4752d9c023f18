"""The config's schema: one section per role, a description on every field, and the checks across fields.

`agentrl config-doc` prints the descriptions as docs/config.md (agentrl/commands/config_doc.py).
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    PrivateAttr,
    SerializeAsAny,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from agentrl.config.algorithm_kinds import TURN_LEVEL_ALGORITHMS
from agentrl.sections import AlgorithmSection, Section, format_validation_error


class LayoutConfig(Section):
    """How many ranks take each role. Ranks are assigned in this order: trainer, rollout, env, scorer."""

    trainer: int = Field(1, ge=1, description="Ranks that train the policy (torch.distributed among them).")
    rollout: int = Field(1, ge=1, description="Ranks that run an inference engine and the multi-turn agent loop.")
    env: int = Field(
        0,
        ge=0,
        description="Ranks that host environments (with agent.command: that run the agent programs); 0 runs each "
        "rollout rank's environments (agent programs) in-process.",
    )
    scorer: int = Field(
        0,
        ge=0,
        description="Ranks that load the scoring model once (reward.model, or a judge's reward.judge.path) and score "
        "the episodes of every rollout rank, batched across them (docs/rewards.md); 0: the model loads on each rollout "
        "rank.",
    )
    colocate: bool = Field(
        False, description="Rollout ranks share the trainer ranks' GPUs (rollout rank i on trainer rank i's GPU)."
    )
    hybrid: bool = Field(
        False,
        description="Every rank both generates and trains, in turns: layout.trainer ranks, each with its own engine "
        "and in-process envs, generating its share of the step's tasks, then all training data parallel on the "
        "step's episodes (no rollout ranks, no weight transfer: each engine copies its trainer's weights in-process). "
        "On-policy, lockstep, torch engine.",
    )

    @model_validator(mode="after")
    def _check_hybrid(self) -> LayoutConfig:
        if not self.hybrid:
            return self
        if "rollout" in self.model_fields_set and self.rollout != self.trainer:
            raise ValueError(
                f"layout.hybrid=true runs the rollout on the {self.trainer} trainer ranks themselves, but "
                f"layout.rollout={self.rollout}; leave layout.rollout out (or equal to layout.trainer)"
            )
        extra = [f"layout.{name}={getattr(self, name)}" for name in ("env", "scorer") if getattr(self, name)]
        if self.colocate:
            extra.append("layout.colocate=true")
        if extra:
            raise ValueError(
                f"layout.hybrid=true runs envs and scoring on each hybrid rank, in-process, but {', '.join(extra)}; "
                "drop those, or set layout.hybrid=false for separate roles"
            )
        return self

    @property
    def world_size(self) -> int:
        if self.hybrid:
            return self.trainer
        return self.trainer + self.rollout + self.env + self.scorer


class TinyModelConfig(Section):
    """A tiny random Qwen2 model and a locally trained tokenizer, built when `model.path` is missing."""

    hidden_size: int = Field(64, ge=8, description="Hidden width.")
    num_layers: int = Field(2, ge=1, description="Transformer blocks.")
    num_heads: int = Field(4, ge=1, description="Attention heads (key/value heads: half of these).")
    vocab_size: int = Field(128, ge=32, description="Upper bound on the BPE vocabulary trained on env texts.")
    seed: int = Field(0, description="Seed of the random initialisation.")
    family: str | None = Field(
        None,
        description="A chat format family with a test model (qwen3, llama3, mistral, harmony, deepseek_v3, "
        "deepseek_r1, glm45, hermes): the tiny model is that family's architecture, its tokenizer has the family's "
        "special tokens and chat template (agentrl/models/families.py); null: agentrl's own Qwen2 model and template.",
    )
    init_std: float = Field(
        0.02, gt=0, description="Std of the normal initialisation of every weight matrix (Qwen2's initializer_range)."
    )
    output_scale: float = Field(
        1.0,
        gt=0,
        description="Initial weight of the final norm, which scales the first logits: below 1 the random model's "
        "first answers are closer to uniform, so no answer is favoured by its random weights before training (a "
        "policy's last layer initialised small, as in cleanrl's PPO). The states stay as distinct as init_std "
        "makes them.",
    )

    @field_validator("family")
    @classmethod
    def _has_test_model(cls, name: str | None) -> str | None:
        from agentrl.models.families import FIXTURES

        if name is not None and name not in FIXTURES:
            raise ValueError(
                f"no tiny test model for chat format {name!r}; families with one: {', '.join(FIXTURES)} "
                "(null: agentrl's own tiny model)"
            )
        return name


LORA_TARGETS_DEFAULT = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoraConfig(Section):
    """LoRA adapters (PEFT): the trainer trains only them; weight syncs send only them (docs/lora.md)."""

    rank: int = Field(8, ge=1, description="Rank r of each adapter (A: r x in, B: out x r).")
    alpha: float = Field(
        16.0, gt=0, description="Scale numerator: the adapter adds (alpha / rank) * B @ A to each target weight."
    )
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the adapter's input while training.")
    target_modules: list[str] = Field(
        default_factory=lambda: list(LORA_TARGETS_DEFAULT),
        min_length=1,
        description="Linear modules that get adapters, by the last part of their name (`q_proj`) or a full "
        "dotted name; a name that matches no module is an error listing the model's module names.",
    )

    modules_to_save: list[str] = Field(
        default_factory=list,
        description="Modules trained whole beside the adapters (PEFT's modules_to_save), by the last part of their "
        "name; synced whole. `[norm]` trains the RMS norms (a few hundred numbers); `embed_tokens` of a model with a "
        "tied output head trains one copy that is both (docs/lora.md#learning-parity-on-the-quickstart).",
    )

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank


class ModelConfig(Section):
    """The policy: any transformers causal LM loadable with `from_pretrained`."""

    path: str = Field(..., description="Local folder or hub id of the model and tokenizer.")
    tiny: TinyModelConfig | None = Field(
        None, description="If set and `path` does not exist, build a tiny model there first (no network needed)."
    )
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="Parameter dtype for training and rollout.")
    lora: LoraConfig | None = Field(
        None,
        description="Train LoRA adapters instead of every weight (`model.lora.rank=8` on the command line, or "
        "`lora: {}` under model:); None: full fine-tuning.",
    )


class ChatConfig(Section):
    """How the model writes a chat turn: its tool calls, its reasoning and the tokens that end it
    (docs/chat-formats.md)."""

    format: str | None = Field(
        None,
        min_length=1,
        description="The model's chat format family: hermes, qwen3, llama3, mistral, harmony, deepseek_v3, "
        "deepseek_r1, glm45, a name registered under the `agentrl.chat_formats` entry point group, or `module:Class`; "
        "null: detected from the model folder (its special tokens, chat template and model_type). `agentrl serve "
        "--chat-format` is the same option.",
    )

    @field_validator("format")
    @classmethod
    def _registered(cls, name: str | None) -> str | None:
        if name is None or ":" in name:
            return name
        from agentrl.chat.registry import ENTRY_POINT_GROUP, registered_names

        known = registered_names()
        if name not in known:
            raise ValueError(
                f"unknown chat format {name!r}; use one of {', '.join(known)}, a 'module:Class' path, or register "
                f"yours under the {ENTRY_POINT_GROUP!r} entry point group (docs/chat-formats.md); null detects it"
            )
        return name

    template_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra variables for the model's chat template, e.g. {enable_thinking: false} (Qwen3, GLM-4.5) or "
        "{reasoning_effort: low} (gpt-oss). The same in every prompt the env loop renders.",
    )
    rewritten: Literal["keep", "new_sample"] = Field(
        "keep",
        description="For templates that are not append-only (Qwen3 drops earlier reasoning once a user message "
        "follows; R1 never writes reasoning back): `keep` keeps each turn's ids as the model generated them and "
        "appends the template's ids for what follows (one sample per episode: what the model saw, the on-policy "
        "choice; its reasoning trained); `new_sample` renders the whole conversation through the template for the "
        "next turn's prompt and trains the tokens before it as a sample of their own (what a client re-sending the "
        "history would get). The same for the env loop and the training gateway (agent programs' sessions). "
        "Append-only templates never meet the choice.",
    )
    train_reasoning: bool = Field(
        True,
        description="Train a turn's reasoning tokens (its <think> block, harmony's analysis channel) at loss mask 1 "
        "like the rest of the turn; false puts them at loss mask 0, so only the answer and the tool calls train.",
    )


class EnvConfig(Section):
    """The environment every episode runs in."""

    id: str = Field("guess_number", description="Registered env id or `module:Class`.")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments for the env constructor.")
    system_prompt: str | None = Field(None, description="Optional system message placed before the first observation.")
    reward_fn: str | None = Field(
        None,
        description="`module:function` scoring a finished episode (see docs/environments.md); None: the env's reward.",
    )
    reward_mode: Literal["replace", "add"] = Field(
        "replace", description="`replace` the env's summed reward with reward_fn's, or `add` reward_fn's to it."
    )
    reuse_instances: bool = Field(
        True,
        description=(
            "Keep a finished episode's env instance for a later episode's reset, instead of closing it and building "
            "another, where the env class says reset sets all its state (`reusable = True`: qa, guess_number, nim, "
            "calculator). Every episode still starts with its own seeded reset; false: a new instance per episode."
        ),
    )


# The placeholders a judge's rubric or a reward model's prompt may name (agentrl/scoring/transcript.py fills them).
SCORING_PLACEHOLDERS = ("task", "completion", "transcript", "answer")
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _check_placeholders(template: str) -> str:
    """`template` unless it names an unknown placeholder or none of the episode's text: the error names the fix."""
    named = set(PLACEHOLDER.findall(template))
    unknown = sorted(named - set(SCORING_PLACEHOLDERS))
    if unknown:
        raise ValueError(
            f"names {', '.join('{' + name + '}' for name in unknown)}, which agentrl does not fill; use "
            f"{', '.join('{' + name + '}' for name in SCORING_PLACEHOLDERS)} (other braces stay as written)"
        )
    if not named & {"completion", "transcript"}:
        raise ValueError(
            "shows the scorer nothing the policy wrote; put {completion} (the last turn) or {transcript} "
            "(every turn) in it"
        )
    return template


# Judge fields that only an endpoint reads: set beside reward.judge.path they would do nothing.
ENDPOINT_ONLY_JUDGE_FIELDS = ("model", "request_extra", "api_key_env", "retries", "concurrency")


class JudgeConfig(Section):
    """An LLM judge: a rubric prompt per finished episode, sent to an OpenAI-compatible endpoint (`agentrl serve` of
    another checkpoint, vLLM, SGLang, a hosted API) or run by agentrl's torch engine over a frozen checkpoint
    (`path`, on layout.scorer ranks); the score is parsed from its reply (docs/rewards.md)."""

    base_url: str | None = Field(
        None,
        min_length=1,
        description="The endpoint's OpenAI base URL, e.g. http://127.0.0.1:8000/v1. Set this or `path`.",
    )
    path: str | None = Field(
        None,
        min_length=1,
        description="A checkpoint or model folder (or hub id) with a tokenizer: the judge runs frozen through "
        "agentrl's torch engine in the job itself, on layout.scorer ranks (without them: on each rollout rank). Set "
        "this or `base_url`.",
    )
    model: str | None = Field(
        None, min_length=1, description="base_url: the `model` of every request (`agentrl serve`'s model name)."
    )
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="path: parameter dtype of the judge model.")
    api: Literal["chat", "completions"] = Field(
        "chat",
        description="`chat`: the rubric goes through the judge's chat template (with `system_prompt` first), as one "
        "/chat/completions request per episode to an endpoint, `judge.concurrency` at once. `completions`: the rubric "
        "is the prompt as written (write any chat template into it yourself); to an endpoint, one /completions request "
        "carries a whole batch of rubric prompts as its `prompt` list.",
    )
    rubric: str = Field(
        ...,
        min_length=1,
        description="The judge's prompt; {task}, {completion}, {transcript} and {answer} are replaced by the "
        "episode's (other braces stay as written). It must name {completion} or {transcript}, and should say how "
        "to write the score (`Score: N`, or JSON with score_format=json).",
    )
    system_prompt: str | None = Field(None, description="api=chat: a system message before the rubric.")
    score_format: Literal["regex", "json"] = Field(
        "regex",
        description="`regex`: the last match of score_pattern in the reply is the score; `json`: the reply is a "
        'JSON object whose "score" is a number (pair it with request_extra.response_format on servers that '
        "constrain output, agentrl serve among them). A reply without a score fails its episode.",
    )
    score_pattern: str = Field(
        r"(?i)score\s*[:=]\s*(-?\d+\.?\d*)",
        description="score_format=regex: a regular expression whose first group is the score (default: "
        "`Score: 7`, `score=7.5`, any case).",
    )
    score_range: tuple[float, float] = Field(
        (0.0, 10.0),
        description="[low, high] the rubric asks for; the reward is (score - low) / (high - low), in [0, 1]. A score "
        "outside it fails its episode.",
    )
    max_tokens: int = Field(64, ge=1, le=32768, description="Tokens the judge may write per reply.")
    temperature: float = Field(0.0, ge=0, le=2, description="The judge's sampling temperature (0: greedy).")
    request_extra: dict[str, Any] = Field(
        default_factory=dict,
        description="More fields merged into every request body (e.g. response_format, seed, top_p).",
    )
    api_key_env: str | None = Field(
        None,
        min_length=1,
        description="Name of the environment variable that holds the endpoint's API key (sent as the Bearer "
        "token); None: no key. The key itself never goes in the config.",
    )
    timeout_s: float = Field(
        60.0, gt=0, le=3600, description="A request not answered within this fails its episodes (after retries)."
    )
    retries: int = Field(
        0, ge=0, le=5, description="Further tries of a request that failed to connect, timed out or got a 5xx."
    )
    batch_size: int = Field(
        16,
        ge=1,
        le=128,
        description="api=completions: rubric prompts per request; api=chat: episodes gathered before their requests "
        "go out together.",
    )
    batch_wait_s: float = Field(
        0.02,
        ge=0,
        le=10,
        description="How long the first episode of a batch waits for more before its batch is sent anyway.",
    )
    concurrency: int = Field(8, ge=1, le=1024, description="Requests to the endpoint in flight at once, per rank.")
    cache_size: int = Field(
        4096,
        ge=0,
        description="Scores kept per rank, by the exact rubric prompt (an identical transcript is judged once); 0: "
        "no cache. Failures are not kept.",
    )

    @field_validator("rubric")
    @classmethod
    def _rubric_placeholders(cls, rubric: str) -> str:
        return _check_placeholders(rubric)

    @model_validator(mode="after")
    def _endpoint_or_path(self) -> JudgeConfig:
        if (self.base_url is None) == (self.path is None):
            raise ValueError(
                "reward.judge needs exactly one of base_url (an OpenAI-compatible endpoint) and path (a checkpoint run "
                "by agentrl's engine on layout.scorer ranks); "
                + ("remove one of them" if self.path is not None else "set one of them")
            )
        if self.base_url is not None and self.model is None:
            raise ValueError(
                "reward.judge.base_url needs reward.judge.model, the `model` of its requests (agentrl serve's "
                "--model-name)"
            )
        # by value, not by what was set: a saved config (run_dir/config.yaml) names every field, defaults too
        fields = type(self).model_fields
        unread = [
            name
            for name in ENDPOINT_ONLY_JUDGE_FIELDS
            if getattr(self, name) != fields[name].get_default(call_default_factory=True)
        ]
        if self.path is not None and unread:
            raise ValueError(
                f"reward.judge.{unread[0]} is for an endpoint (base_url), but reward.judge.path runs the judge in the "
                f"job; remove reward.judge.{unread[0]}"
            )
        if self.base_url is not None and self.dtype != fields["dtype"].get_default():
            raise ValueError(
                "reward.judge.dtype is for a judge run in the job (path); the endpoint at base_url loads its own "
                "model: remove reward.judge.dtype"
            )
        return self

    @property
    def where(self) -> str:
        """The judge, as errors name it: `MODEL at URL`, or its checkpoint."""
        return f"{self.model} at {self.base_url}" if self.base_url is not None else str(self.path)

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, url: str | None) -> str | None:
        if url is None:
            return None
        if not url.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://, e.g. http://127.0.0.1:8000/v1")
        return url.rstrip("/")

    @field_validator("score_pattern")
    @classmethod
    def _one_group(cls, pattern: str) -> str:
        try:
            groups = re.compile(pattern).groups
        except re.error as error:
            raise ValueError(f"is not a regular expression ({error}); e.g. (?i)score\\s*:\\s*(\\d+)") from error
        if groups < 1:
            raise ValueError("needs a group around the number, e.g. (?i)score\\s*:\\s*(\\d+)")
        return pattern

    @field_validator("score_range")
    @classmethod
    def _ordered(cls, bounds: tuple[float, float]) -> tuple[float, float]:
        low, high = bounds
        if not (math.isfinite(low) and math.isfinite(high)) or low >= high:
            raise ValueError("must be two finite numbers [low, high] with low < high, e.g. [0, 10]")
        return bounds


class RewardModelConfig(Section):
    """A reward model: a transformers sequence-classification model (`AutoModelForSequenceClassification`) scores
    each finished episode, on the rollout ranks that ran it (one process: in it), batched (docs/rewards.md)."""

    path: str = Field(..., min_length=1, description="Local folder or hub id of the reward model and its tokenizer.")
    prompt: str | None = Field(
        None,
        description="The text scored, with {task}, {completion}, {transcript} and {answer} replaced; None: the "
        "conversation (task, then every turn and observation) through the model's chat template.",
    )
    label: int = Field(0, ge=0, description="The logit read as the score (0 for a one-label reward model).")
    transform: Literal["raw", "sigmoid"] = Field(
        "raw", description="`raw`: the logit is the reward; `sigmoid`: squashed to (0, 1)."
    )
    max_length: int = Field(
        2048, ge=8, description="Tokens scored per episode; a longer text fails its episode (never cut silently)."
    )
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="Parameter dtype of the reward model.")
    batch_size: int = Field(16, ge=1, le=4096, description="Episodes per forward pass.")
    batch_wait_s: float = Field(
        0.02,
        ge=0,
        le=10,
        description="How long the first episode of a batch waits for more before its forward runs anyway.",
    )
    timeout_s: float = Field(300.0, gt=0, le=3600, description="A forward not done within this fails its episodes.")
    cache_size: int = Field(4096, ge=0, description="Scores kept per rank, by the exact text scored; 0: no cache.")

    @field_validator("prompt")
    @classmethod
    def _prompt_placeholders(cls, prompt: str | None) -> str | None:
        return None if prompt is None else _check_placeholders(prompt)


class RewardConfig(Section):
    """A model scores each finished episode instead of (or besides) the env: an LLM judge or a reward model
    (docs/rewards.md). A judge that is down, slow or unparsable fails the episode with the reason (episode/failed),
    never a silent 0; runtime.abort_on_failed_fraction decides whether the run goes on."""

    judge: JudgeConfig | None = Field(
        None, description="An LLM judge over an OpenAI-compatible endpoint, or a frozen checkpoint run in the job."
    )
    model: RewardModelConfig | None = Field(None, description="A sequence-classification reward model.")
    mode: Literal["replace", "add"] = Field(
        "replace", description="`replace` the env's summed reward with the score, or `add` the score to it."
    )
    success_at: float | None = Field(
        None,
        description="An episode whose score (the judge's in [0, 1], the reward model's after `transform`) is at or "
        "above this counts as a success; None: success stays the env's.",
    )

    @model_validator(mode="after")
    def _one_scorer(self) -> RewardConfig:
        if self.judge is not None and self.model is not None:
            raise ValueError(
                "reward.judge and reward.model both score the episode; set one of them (a reward_fn can combine "
                "several scores)"
            )
        return self

    @property
    def enabled(self) -> bool:
        return self.judge is not None or self.model is not None

    @property
    def loads_a_model(self) -> bool:
        """Whether scoring loads a model into the job (reward.model, or a judge's path): what scorer ranks serve."""
        return self.model is not None or (self.judge is not None and self.judge.path is not None)

    @property
    def scorer_name(self) -> str:
        """The scorer as errors name it: reward.judge or reward.model, and which."""
        if self.judge is not None:
            return f"reward.judge ({self.judge.where})"
        return f"reward.model ({self.model.path})"


class TorchEngineConfig(Section):
    """The built-in torch engine: batched KV-cache decoding on CPU or one GPU."""

    backend: Literal["torch"] = "torch"
    max_batch_size: int = Field(256, ge=1, description="Most sequences decoded at once.")
    scheduler: Literal["batch", "continuous"] = Field(
        "batch",
        description="batch: the requests pending together run as one batch to completion, each turn prefilled "
        "from its first token; continuous: requests join the running batch at the next step and an episode's "
        "KV cache is kept between its turns (1.6x to 3x the batch scheduler's tokens/s on the multi-turn episodes of "
        "benchmarks/bench_engine.py, faster by medians on its single-turn workloads; docs/engine.md).",
    )
    kv_cache_mb: float = Field(
        256,
        ge=0,
        description="Memory for KV caches kept between an episode's turns (continuous scheduler); the least "
        "recently kept go first when it is full, and their episodes are prefilled again; 0 keeps none.",
    )
    cuda_graphs: Literal["auto"] | bool = Field(
        "auto",
        description="Continuous scheduler: decode steps and the prefills of joining rows at fixed shapes over a "
        "slot KV cache, captured as CUDA graphs per bucket and replayed (one launch per step instead of hundreds), "
        "with sampling read back one step behind. `auto`: on CUDA for the model families the lean decoder serves "
        "(Llama, Qwen2/3, Mistral); `true` also on CPU, where the same steps run eagerly (for tests); `false`: never.",
    )
    steps_on: Literal["auto", "loop", "thread"] = Field(
        "auto",
        description="Where the model's steps run: `loop`: on the rollout's event loop thread, between the episodes' "
        "own work (no hand-over to a thread and back at every step: on CPU, where a small model's step is a few "
        "ms, that costs a tenth to a fifth of it); `thread`: on the engine's worker thread, so that the event "
        "loop calls envs, parses turns and serves HTTP while a step runs; `auto`: loop on CPU, thread on a GPU, "
        "where agent programs call the policy over HTTP (agent:), and where the batch scheduler's batch would "
        "hold up the loop's own work: running ahead of the trainer (max_staleness > 0: a look for new weights) or "
        "serving the other rollout ranks' task claims (dispatch=dynamic).",
    )

    @property
    def gpus(self) -> int:
        """GPUs one engine uses (the layout binds them): the torch engine runs on one."""
        return 1


class SGLangEngineConfig(Section):
    """An in-process `sglang.Engine` per rollout rank (GPU; the `agentrl[sglang]` extra)."""

    backend: Literal["sglang"] = "sglang"
    tp_size: int = Field(1, ge=1, description="Tensor-parallel GPUs per engine (one engine per rollout rank).")
    mem_fraction_static: float = Field(
        0.8, gt=0, lt=1, description="GPU memory fraction for weights and KV cache (lower it when colocated)."
    )
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Extra keyword arguments for `sglang.Engine`.")

    @property
    def gpus(self) -> int:
        """GPUs one engine uses (the layout binds them): its tensor-parallel size."""
        return self.tp_size


EngineConfig = Annotated[TorchEngineConfig | SGLangEngineConfig, Field(discriminator="backend")]


class RolloutConfig(Section):
    """Generation and the multi-turn agent loop on rollout ranks."""

    tasks_per_step: int = Field(
        16, ge=1, description="Distinct tasks (env seeds or dataset rows) per training step, all ranks together."
    )
    group_size: int = Field(8, ge=2, description="Episodes per task; group baselines compare episodes within a group.")
    max_turns: int = Field(8, ge=1, description="Assistant turns before an episode is cut off.")
    max_new_tokens: int = Field(32, ge=1, description="Tokens the model may generate in one turn.")
    max_episode_tokens: int = Field(512, ge=8, description="Token budget of a whole episode (prompt + all turns).")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature (the trainer divides logits by it too).")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling threshold.")
    top_k: int = Field(-1, ge=-1, description="Top-k filter; -1 disables it.")
    engine: EngineConfig = Field(
        default_factory=TorchEngineConfig,
        description="The inference engine, chosen by `backend` (torch | sglang; torch when not given), with that "
        "engine's own options.",
    )

    @field_validator("engine", mode="before")
    @classmethod
    def _torch_unless_named(cls, value):
        """`rollout.engine.scheduler=continuous` alone means the torch engine's option: `backend` defaults to torch."""
        if isinstance(value, dict) and "backend" not in value:
            return {"backend": "torch", **value}
        return value

    dump_episodes: bool = Field(
        False,
        description="Write every step's episodes (task id, reward, finish, chat messages with tool calls) to "
        "run_dir/episodes/step_NNNNNN.jsonl (the trainer leader writes them).",
    )
    max_staleness: int = Field(
        0,
        ge=0,
        description="Asynchronous rollouts: rollout ranks generate up to K steps ahead of the trainer, so the "
        "episodes of step s come from weights s-K or newer (0: lockstep, today's schedule). Needs separate "
        "trainer and rollout ranks. Older episodes are dropped and counted (`async/dropped_stale`).",
    )
    partial_rollouts: bool = Field(
        True,
        description="With max_staleness >= 1: new weights reach episodes in flight at their next turn "
        "(each token records the version that generated it); false: every episode runs on one version, new "
        "weights are taken between steps (dispatch=dynamic: also mid-step while none of the rank's groups runs).",
    )
    dispatch: Literal["static", "dynamic"] = Field(
        "static",
        description="How a step's tasks reach rollout ranks. `static`: each rank runs a fixed share "
        "(tasks_per_step / rollout ranks; bit-reproducible). `dynamic`: ranks claim tasks one group at a "
        "time from a queue on rollout rank 0, so a rank slowed by long episodes or a slow env takes fewer "
        "(time/rollout_spread shows the imbalance). Dynamic with max_staleness >= 1 on several rollout ranks "
        "needs the torch engine.",
    )
    groups_in_flight: int | None = Field(
        None,
        ge=1,
        description="dispatch=dynamic: groups a rank runs at once (it claims the next task as one ends); "
        "None: half its static share, at least 1.",
    )


class AgentConfig(Section):
    """An agent program trained through the gateway instead of an env (docs/agents.md): each episode opens a
    session of the policy under training at its own OpenAI-style URL and key."""

    command: str | list[str] | None = Field(
        None,
        description="The agent program, started once per episode: the task row as JSON on stdin and in "
        "AGENTRL_TASK, OPENAI_BASE_URL and OPENAI_API_KEY set to its session's. Its reward: a POST to the "
        'session\'s /reward, a last stdout line {"reward": x}, or env.reward_fn over the transcript.',
    )
    service: bool = Field(
        False,
        description="A long-lived agent service claims each episode's session (POST /sessions/claim with the "
        "service key in run_dir/gateway.json) and ends it (POST /sessions/{id}/end); instead of `command`.",
    )
    timeout_s: float = Field(
        300.0,
        gt=0,
        description="An episode's agent still running after this fails (a command is killed; a service's time counts "
        "from its claim).",
    )
    claim_timeout_s: float = Field(
        600.0, gt=0, description="agent.service: a session no service claimed within this fails its episode."
    )
    cwd: str | None = Field(None, description="Working folder of `command` (default: where agentrl was started).")
    host: str = Field("127.0.0.1", description="Address the gateway listens on (0.0.0.0: every interface).")
    port: int = Field(
        0,
        ge=0,
        le=65535,
        description="Gateway port of the first rollout rank on a node (the next ranks: +1, ...); 0: free ports.",
    )
    model_name: str = Field("policy", description="The model id the gateway serves (the requests' `model`).")
    list_tools: bool = Field(
        True,
        description="Put the request's `tools` in the prompt (the template's way, or a system message for a template "
        "without tools); false for a model that learnt the call format in training, as the calculator env's "
        "`list_tools: false`. Replies are parsed for tool calls either way.",
    )
    max_body_bytes: int = Field(
        4 << 20,
        ge=1024,
        description="The largest request body the gateway reads (4 MiB: 8x the JSON of a 128k-token conversation); "
        "a larger one gets 413 before it is read, with no work done.",
    )

    @property
    def enabled(self) -> bool:
        return self.command is not None or self.service

    @model_validator(mode="after")
    def _one_way(self) -> AgentConfig:
        if self.command is not None and self.service:
            raise ValueError("agent.command and agent.service=true are two ways to run the agent; set one of them")
        if (isinstance(self.command, str) and not self.command.strip()) or self.command == []:
            raise ValueError("agent.command is empty; name the program to run, e.g. agent.command='python agent.py'")
        return self


class DataConfig(Section):
    """Tasks from a dataset instead of env seeds: each row reaches the env as `reset(seed=..., options=row)`.

    Rows are sharded over rollout ranks, shuffled per epoch from `seed`, and the position is saved in
    every checkpoint, so a resumed run goes on with the next unseen row.
    """

    train: str | None = Field(
        None,
        description="Training rows: a .jsonl/.json or .parquet file, a folder written by `datasets.save_to_disk`, "
        "or a hub dataset id (`name` or `name:split`); None: tasks are env seeds.",
    )
    val: str | None = Field(None, description="Held-out rows, in any form `train` takes (for evaluation).")
    shuffle: bool = Field(True, description="Shuffle the rows every epoch (from `seed` and the epoch number).")


class EvalConfig(Section):
    """Held-out evaluation on the rollout ranks between training steps, with its own sampling and seeds.

    It never touches the training run's random streams: training is bit-identical with or without it.
    `agentrl eval CONFIG --checkpoint PATH` runs the same evaluation on any checkpoint or model folder.
    """

    every: int = Field(0, ge=0, description="Evaluate every N training steps (on the weights of step N); 0: never.")
    before_train: bool = Field(False, description="Also evaluate the starting weights, at step 0.")
    split: Literal["val", "seeds"] | None = Field(
        None,
        description="`val`: the rows of `data.val`; `seeds`: env seeds `seeds[0]` .. `seeds[0] + seeds[1] - 1` "
        "(seeded envs); None: `val` when `data.val` is set, else `seeds`.",
    )
    seeds: tuple[int, int] = Field(
        (1_000_000, 64), description="`split: seeds`: [first seed, count] of the env seeds evaluated."
    )
    max_tasks: int | None = Field(
        None, ge=1, description="Evaluate only the first N tasks of the split (file order); None: all of them."
    )
    n: int = Field(1, description="Episodes per task; pass@k is reported for k = 1, 2, 4, ... up to n.")
    temperature: float = Field(0.0, ge=0, description="Sampling temperature of evaluation; 0: greedy.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling threshold of evaluation.")
    top_k: int = Field(-1, ge=-1, description="Top-k filter of evaluation; -1 disables it.")
    seed: int = Field(
        0,
        description="Seed of evaluation's sampling (each episode's turns draw from seeds made from it, the task "
        "and the sample), independent of the training seed and of the number of rollout ranks.",
    )
    dump_episodes: bool = Field(
        False, description="Write each evaluation's episodes to run_dir/eval/episodes/step_NNNNNN.jsonl."
    )

    @field_validator("n")
    @classmethod
    def _at_least_one(cls, value: int) -> int:
        if value < 1:
            raise ValueError("samples per task must be at least 1; set eval.n=1 (or more for pass@k)")
        return value

    @field_validator("seeds")
    @classmethod
    def _seed_range(cls, value: tuple[int, int]) -> tuple[int, int]:
        if value[1] < 1:
            raise ValueError("is [first seed, count]; the count must be at least 1, e.g. eval.seeds=[1000000,64]")
        return value

    @property
    def enabled(self) -> bool:
        return self.every > 0 or self.before_train

    def split_of(self, data_val: str | None) -> str:
        """The split evaluated: `split`, or its default (val when data.val is set)."""
        return self.split or ("val" if data_val else "seeds")

    def due(self, step: int) -> bool:
        """Whether an evaluation runs at `step` (before that step's rollout; `steps` itself: after the last)."""
        return (step == 0 and self.before_train) or (step > 0 and self.every > 0 and step % self.every == 0)


class OptimizerConfig(Section):
    """The policy's optimizer."""

    name: Literal["adamw"] = Field("adamw", description="Optimizer (torch.optim.AdamW).")
    lr: float = Field(1e-3, gt=0, description="Peak learning rate.")
    betas: tuple[float, float] = Field((0.9, 0.99), description="AdamW betas.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping by global norm.")
    fused: Literal["auto"] | bool = Field(
        "auto",
        description="torch's fused AdamW: one kernel over all parameters instead of a few ops per tensor (0.25 "
        "against 1.3 ms a step for the tiny model's 26 tensors on CPU); its float rounding differs from the "
        "per-tensor loop's in the last bits (about 1e-7 relative after a step). `auto`: fused where torch has the "
        "kernel for the parameters' device and dtype (CPU, CUDA...; floating point); `true`: fused, refused where "
        "torch has none; `false`: torch's default (foreach on GPU, the per-tensor loop on CPU).",
    )


class LRSchedulerConfig(Section):
    """Learning rate over the run: linear warm-up, then a decay."""

    decay: Literal["constant", "linear", "cosine"] = Field("constant", description="Decay after warm-up.")
    warmup_steps: int = Field(0, ge=0, description="Linear warm-up steps (optimizer steps).")
    min_lr_ratio: float = Field(
        0.1, ge=0, le=1, description="Final LR as a fraction of `optimizer.lr` (linear/cosine)."
    )


class TrainerConfig(Section):
    """How each batch is trained: micro-batches and optimizer steps per batch."""

    micro_batch_size: int = Field(16, ge=1, description="Episodes per forward/backward pass.")
    updates_per_step: int = Field(
        1, ge=1, description="Optimizer steps per batch (mini-batches); >1 is off-policy PPO."
    )
    max_skipped_nonfinite: int | None = Field(
        3,
        description="An optimizer update whose loss or gradient norm is not finite (NaN, inf) is skipped on every "
        "trainer rank, leaving weights and optimizer state untouched (`train/skipped_nonfinite` counts them); the "
        "run stops after this many in a row (1: at the first). `null`: skip them and never stop.",
    )
    shared_prefix: bool = Field(
        False,
        description="Forward the tokens a group's episodes share once per micro-batch: the prompt, and in "
        "multi-turn episodes every turn that episodes of the group played alike. Per micro-batch the cheapest of "
        "three layouts: packed sequences, each a prefix then the rests of some of its episodes, under a 4D "
        "attention mask (a rest sees its prefix and itself); each group's episodes as a prefix tree (a token sees "
        "its ancestors), packed into sequences (which also packs short episodes together); or the prefixes forwarded "
        "first and the rests on their KV cache. The same loss and gradients up to float rounding, fewer positions "
        "computed (`train/shared_prefix_positions`). A micro-batch where no layout costs less (groups of one of "
        "like lengths, short prompts before long rests) forwards whole rows. Needs sdpa or eager attention and no "
        "sliding-window layers; not with parallelism.fsdp or parallelism.activation_checkpointing (not tested).",
    )

    @field_validator("max_skipped_nonfinite")
    @classmethod
    def _skip_limit(cls, value: int | None) -> int | None:
        if value is not None and value < 1:
            raise ValueError("must be at least 1 (1: stop at the first update that is not finite) or null (never stop)")
        return value


class ParallelismConfig(Section):
    """How trainer ranks share the model: replicas (default) or FSDP2 shards."""

    fsdp: bool = Field(
        False, description="Shard parameters, gradients and optimizer state across trainer ranks with FSDP2."
    )
    mixed_precision: Literal["none", "bf16"] = Field(
        "none", description="`bf16`: compute in bfloat16 over float32 master weights (FSDP2 on GPU)."
    )
    activation_checkpointing: bool = Field(False, description="Recompute each decoder layer's activations in backward.")


class WeightsConfig(Section):
    """Weights from the trainer leader to the rollout engines, versioned and in buckets."""

    transport: Literal["auto", "shm", "mpi", "nccl", "gloo", "cuda_ipc"] = Field(
        "auto",
        description="`shm` (CPU: written once per node into MPI shared memory, one broadcast per bucket across "
        "nodes), `mpi` (CPU: a broadcast to every rollout rank), `nccl` (broadcast), `cuda_ipc` (every rollout "
        "rank on the trainer leader's GPU), `gloo` (the NCCL path's process-group broadcast on CPU); "
        "`auto` decides from where the trainer leader and the rollout ranks sit (`agentrl layout` shows it): "
        "shm without GPUs, nccl when each has a GPU of its own, cuda_ipc when every rollout rank is on the "
        "trainer leader's GPU, else shm (through host memory).",
    )
    bucket_mb: float = Field(
        64.0,
        gt=0,
        description="Size of one bucket in MiB. `shm`: a model up to this size goes in one round; a larger one "
        "through two slots of this size per node.",
    )
    shm_mapped: Literal["auto"] | bool = Field(
        "auto",
        description="`shm`: rollout engines use the shared window itself as their weights, no copy per rank "
        "(`true`; a node holds two versions in shared memory, and no rollout rank a copy of its own), or copy "
        "them out (`false`; two buckets of shared memory per node). `auto`: `true` where a node has two or "
        "more rollout ranks. Engines that cannot (SGLang, GPUs) copy either way.",
    )
    shm_in_place: Literal["auto"] | bool = Field(
        "auto",
        description="`shm` with mapped weights, lockstep runs (`rollout.max_staleness=0`): the trainer leader's "
        "parameters live in its node's shared window, so its optimizer writes each version where the engines "
        "view it and a sync copies nothing there (`true`; needs whole CPU parameters, not FSDP shards), or the "
        "trainer copies each version into the window (`false`). `auto`: `true` where it can be.",
    )


def _default_algorithm() -> AlgorithmSection:
    from agentrl.algorithms.grpo import GRPOOptions

    return GRPOOptions()


def algorithm_options(value: Any) -> AlgorithmSection:
    """The `algorithm:` mapping validated by the options class of the algorithm it names."""
    if isinstance(value, AlgorithmSection):
        return value
    value = {} if value is None else value
    if not isinstance(value, dict):
        raise PydanticCustomError("nested_section", "algorithm: must be a mapping such as {name: grpo}")
    from agentrl.algorithms.registry import resolve

    name = value.get("name", "grpo")
    try:
        options_class = resolve(str(name)).Options
    except (KeyError, ImportError, AttributeError, TypeError, ValueError) as error:
        message = error.args[0] if isinstance(error, KeyError) else str(error)
        raise PydanticCustomError("nested_section", "algorithm.name: {message}", {"message": message}) from None
    try:
        return options_class.model_validate(value)
    except ValidationError as error:
        lines = format_validation_error(error, "").splitlines()[1:]
        detail = "\n".join(f"  algorithm.{line.strip()}" for line in lines)
        fields = ", ".join(options_class.model_fields)
        raise PydanticCustomError(
            "nested_section",
            "{detail}\n  (options of algorithm {name}: {fields})",
            {"detail": detail, "name": name, "fields": fields},
        ) from None


class CheckpointConfig(Section):
    """Hugging Face model folders plus optimizer, RNG and step, written atomically."""

    every: int = Field(50, ge=0, description="Save every N steps (and at the end); 0 saves only at the end.")
    keep: int = Field(2, ge=1, description="Checkpoints kept; older ones are deleted.")
    checksums: bool = Field(
        True,
        description="Record each file's sha256 in the checkpoint's manifest and check it on resume; "
        "false checks sizes only (hashing reads every byte, about 1 s per GB).",
    )


TRACKING_BACKENDS = ("tensorboard", "wandb", "mlflow")


class WandbConfig(Section):
    """Weights & Biases, when `logging.backends` lists `wandb` (the `agentrl[wandb]` extra; docs/tracking.md)."""

    mode: Literal["online", "offline"] | None = Field(
        None,
        description="online: upload as it trains (needs `wandb login` or WANDB_API_KEY); offline: a run folder in "
        "run_dir/wandb that `wandb sync` uploads later; null: the WANDB_MODE variable, else online.",
    )
    entity: str | None = Field(None, description="W&B team or user; null: the account's default entity.")


class MlflowConfig(Section):
    """MLflow, when `logging.backends` lists `mlflow` (the `agentrl[mlflow]` extra; docs/tracking.md)."""

    tracking_uri: str | None = Field(
        None,
        description="Where runs go (a server's http(s)://, a database, a folder); null: the MLFLOW_TRACKING_URI "
        "variable, else a local file store in run_dir/mlruns (a sweep's trials: one store in its sweep_dir).",
    )


class LoggingConfig(Section):
    """TensorBoard on the trainer leader, a console progress bar, and optionally W&B and MLflow with the same
    scalars, the resolved config and the text samples (docs/tracking.md)."""

    sample_every: int = Field(10, ge=0, description="Write sample episodes as text every N steps; 0: never.")
    num_samples: int = Field(2, ge=0, description="Episodes per text sample.")
    progress: bool = Field(True, description="Show a console progress bar.")
    backends: list[Literal["tensorboard", "wandb", "mlflow"]] = Field(
        default_factory=lambda: ["tensorboard"],
        description="Where scalars, the config and samples go: tensorboard (always on, listed or not), wandb, "
        "mlflow; e.g. `logging.backends=[tensorboard,wandb]`. wandb and mlflow are optional extras.",
    )
    project: str = Field(
        "agentrl", min_length=1, description="W&B project; the MLflow experiment when `group` is not set."
    )
    group: str | None = Field(
        None,
        description="Runs that belong together: the W&B group and the MLflow experiment. `agentrl sweep` sets it "
        "to the sweep folder's name for every trial.",
    )
    run_name: str | None = Field(None, description="The run's name in W&B and MLflow; null: run_dir's folder name.")
    wandb: WandbConfig = Field(default_factory=WandbConfig)
    mlflow: MlflowConfig = Field(default_factory=MlflowConfig)

    @field_validator("backends", mode="before")
    @classmethod
    def _backends(cls, value):
        if isinstance(value, str):  # logging.backends=wandb
            value = [value]
        if isinstance(value, list):  # TensorBoard always writes (agentrl sweep reads its scalars): first, once
            value = ["tensorboard", *(name for name in value if name != "tensorboard")]
            if len(set(value)) != len(value):
                raise ValueError(f"{value[1:]} lists a backend twice; list each of {', '.join(TRACKING_BACKENDS)} once")
        return value


class RuntimeConfig(Section):
    """Process-level settings."""

    torch_threads: int = Field(
        0, ge=0, description="torch threads per rank; 0 = cores on the node / ranks on the node."
    )
    pin_cores: bool = Field(
        False,
        description=(
            "Linux, ranks on CPU: trainer ranks keep cores of their own (a share of the node's by rank count, at "
            "least one) and the other ranks share the rest (sched_setaffinity), so with rollout.max_staleness >= 1 "
            "training does not share a core with generation (docs/performance.md#asynchronous-rollouts)."
        ),
    )
    yield_to_trainer: Literal["auto"] | bool = Field(
        False,
        description=(
            "Linux, ranks on CPU: the rollout, env and scorer ranks on a node with a trainer rank run at a lower "
            "scheduling priority (nice +10), so the trainer, which paces a step, gets a core whenever it needs one "
            "and the others take what it leaves (unlike runtime.pin_cores, no core stays idle). auto: on when "
            "rollout.max_staleness >= 1 and the node's ranks outnumber its cores. Off by default: on the quickstart "
            "at rollout.max_staleness=1 it made no difference (docs/performance.md#asynchronous-rollouts)."
        ),
    )
    keep_freed_memory: bool = Field(
        True,
        description=(
            "Linux with glibc: each rank's heap keeps up to 256 MiB of the memory its tensors free, and serves blocks "
            "under 64 MiB itself, so the next step's tensors reuse those pages instead of faulting in fresh zeroed "
            "ones (the quickstart on 2 cores: 5-11% less time; "
            "docs/performance.md#freed-memory-kept-in-each-ranks-heap). A rank's memory then shrinks less after a "
            "peak. MALLOC_MMAP_THRESHOLD_ or MALLOC_TRIM_THRESHOLD_ in the environment takes precedence."
        ),
    )
    env_step_timeout_s: float | None = Field(
        60.0,
        gt=0,
        description=(
            "Seconds one env call (reset/step/close) may take; a slower call ends its episode as an error. Calls run "
            "in worker threads, or on the rank's own thread while they are quick (env_quick_calls_inline). null: no "
            "limit, env code runs on the rank's own thread, without hand-offs between threads, and a hung env call "
            "hangs the rank."
        ),
    )
    env_quick_calls_inline: bool = Field(
        True,
        description=(
            "Linux: while an env's batches of calls end within 10 ms, run the next batch on the rank's main thread "
            "instead of a worker thread (two hand-overs between threads saved a batch), under the same "
            "env_step_timeout_s: a timer signal to that thread raises inside a call at the deadline, ending its "
            "episode as a timeout, and a call still running long after that (blocked in C code, or catching "
            "BaseException) ends the job with its stack. A slower batch moves the env back to worker threads. "
            "false: always worker threads, where a call past its deadline is abandoned."
        ),
    )
    peer_timeout_s: float | None = Field(
        60.0,
        gt=0,
        description=(
            "Jobs over several nodes: end the job when a node has not been heard from for this many seconds (a cut "
            "link or a frozen node, which MPI over TCP would not notice for many minutes); each node's first rank "
            "beats once a second from a thread, so long phases (model load, checkpoint, weight sync) do not count "
            "as silence. `null` never ends it. No effect on one node (docs/slurm.md#node-faults)."
        ),
    )
    abort_on_failed_fraction: float | None = Field(
        1.0,
        description="Stop the run when, in one step, at least this fraction of the episodes failed with the same "
        "error (1.0: all of them); `null` never stops. Fewer failures stay contained in their episodes.",
    )

    @field_validator("abort_on_failed_fraction")
    @classmethod
    def _fraction(cls, value: float | None) -> float | None:
        if value is not None and not 0 < value <= 1:
            raise ValueError("must be a fraction in (0, 1] (1.0: stop when every episode failed alike), or null")
        return value


class PolicyConfig(Section):
    """One named policy of a multi-policy job (`policies:`, docs/multi-agent.md): its model, algorithm, optimizer and
    trainer ranks. A section left out is the top-level one of the same name."""

    model: ModelConfig | None = Field(
        None, description="The policy's model (a model.lora section trains an adapter); null: the top-level model."
    )
    algorithm: SerializeAsAny[AlgorithmSection] | None = Field(
        None, description="The policy's algorithm with its options; null: the top-level algorithm."
    )
    optimizer: OptimizerConfig | None = Field(None, description="The policy's optimizer; null: the top-level one.")
    lora: LoraConfig | None = Field(
        None,
        description="The policy is a LoRA adapter on the top-level model (shorthand for model: {path: <model.path>, "
        "lora: ...}); policies that are adapters on one base share it on the rollout ranks (docs/multi-agent.md).",
    )
    trainers: int = Field(
        1, ge=0, description="Trainer ranks of this policy; the policies' trainer ranks add up to layout.trainer."
    )
    train: bool = Field(True, description="false: a fixed policy, which plays its seats and never trains.")

    @field_validator("algorithm", mode="before")
    @classmethod
    def _algorithm_options(cls, value):
        return None if value is None else algorithm_options(value)


class OpponentConfig(Section):
    """Who sits across from the learner in a self-play game: itself, a frozen snapshot from the pool, or a program."""

    kind: Literal["self", "pool", "program"] = Field(
        ...,
        description="self: the learner itself (every seat trains); pool: a frozen snapshot of it drawn by "
        "game.pool.sampling; program: `program`, a fixed Python function.",
    )
    weight: float = Field(1.0, gt=0, description="Relative chance that a game draws this opponent.")
    program: str | None = Field(
        None, description="kind=program: `module:function`, called as function(observation, rng) -> action text."
    )
    name: str | None = Field(None, description="The opponent's name in logs (game/win_rate_vs/NAME); null: kind.")

    @model_validator(mode="after")
    def _program_named(self) -> OpponentConfig:
        if (self.kind == "program") != (self.program is not None):
            raise ValueError(
                "program: set it (`module:function`) exactly when kind=program; "
                f"here kind={self.kind} and program={self.program!r}"
            )
        return self

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        return self.program.rpartition(":")[2] if self.program else self.kind


class OpponentPoolConfig(Section):
    """Frozen snapshots of the learner for `kind: pool` opponents, kept on the rollout ranks and in run_dir."""

    every: int = Field(10, ge=1, description="Snapshot the learner's weights every N steps (and at step 0).")
    size: int = Field(5, ge=1, description="Snapshots kept: the newest N.")
    sampling: Literal["uniform", "recent"] = Field(
        "uniform", description="uniform: every kept snapshot alike; recent: each older one `decay` times as likely."
    )
    decay: float = Field(0.5, gt=0, le=1, description="sampling=recent: the weight ratio of a snapshot to the next.")


class GameEvalConfig(Section):
    """Held-out matches: the learner against fixed programs it never trains against, logged as game_eval/."""

    every: int = Field(10, ge=1, description="Play them every N steps (and at the last step).")
    games: int = Field(64, ge=1, description="Games per opponent, split over rollout ranks; seats alternate.")
    temperature: float = Field(0.0, ge=0, description="The learner's sampling temperature there (0: greedy).")
    opponents: list[OpponentConfig] = Field(default_factory=list, description="The programs to play (kind: program).")

    @field_validator("opponents")
    @classmethod
    def _programs_only(cls, value: list[OpponentConfig]) -> list[OpponentConfig]:
        for opponent in value:
            if opponent.kind != "program":
                raise ValueError(f"lists kind={opponent.kind}; held-out matches are against programs (kind: program)")
        return value


class GameConfig(Section):
    """A multi-agent env's seats: which policy plays each player id the env names (info["player"])."""

    players: dict[str, str] = Field(
        ..., min_length=1, description="Player id (as the env names it in info['player']) -> the policy that plays it."
    )
    opponents: list[OpponentConfig] = Field(
        default_factory=list,
        description="Self-play: when every player is one policy, each game seats it once (seats alternate) and draws "
        "the other seats' opponent from this list by weight; empty: it plays itself in every seat.",
    )
    pool: OpponentPoolConfig = Field(default_factory=OpponentPoolConfig)
    evaluate: GameEvalConfig | None = Field(None, description="Held-out matches against programs; null: none.")


class Config(Section):
    """The whole run."""

    run_dir: str = Field("runs/default", description="Folder for config, checkpoints and TensorBoard events.")
    steps: int = Field(100, ge=1, description="Training steps (one batch of episodes and one weight update each).")
    seed: int = Field(0, description="Seed for task sampling and generation.")
    resume: bool = Field(False, description="Continue from the latest checkpoint in run_dir.")
    layout: LayoutConfig = Field(default_factory=LayoutConfig)
    model: ModelConfig
    chat: ChatConfig = Field(default_factory=ChatConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    agent: AgentConfig = Field(default_factory=AgentConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    algorithm: SerializeAsAny[AlgorithmSection] = Field(
        default_factory=_default_algorithm,
        description="The RL algorithm, chosen by `name`, with that algorithm's own options (`agentrl algorithms`).",
    )
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    lr_scheduler: LRSchedulerConfig = Field(default_factory=LRSchedulerConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    parallelism: ParallelismConfig = Field(default_factory=ParallelismConfig)
    weights: WeightsConfig = Field(default_factory=WeightsConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    policies: dict[str, PolicyConfig] = Field(
        default_factory=dict,
        description="Several policies in one job, by name (docs/multi-agent.md); empty: the one policy of `model`.",
    )
    game: GameConfig | None = Field(
        None, description="With `policies`: which policy plays each of the env's players, and self-play opponents."
    )

    _notes: list[str] = PrivateAttr(default_factory=list)  # renamed fields found in the input, said once by rank 0

    @field_validator("algorithm", mode="before")
    @classmethod
    def _algorithm_options(cls, value):
        return algorithm_options(value)

    @model_validator(mode="after")
    def _verifiers_through_the_gateway(self) -> Config:
        """`env.id: verifiers:TASKSET`: verifiers environments drive an OpenAI client themselves, so they run as the
        agent program agentrl.env.adapters.verifiers (agent.command) against the gateway, not as a TextEnv."""
        if self.env.id.startswith("verifiers:") and not self.agent.enabled:
            from agentrl.env.adapters.verifiers import agent_command

            self.agent.command = agent_command(self.env.id, self.env.kwargs, self.agent.model_name)
        return self

    @model_validator(mode="after")
    def _check_cross_fields(self) -> Config:
        if self.layout.hybrid and self.rollout.tasks_per_step % self.layout.trainer:
            raise ValueError(
                f"rollout.tasks_per_step={self.rollout.tasks_per_step} must be a multiple of layout.trainer="
                f"{self.layout.trainer} with layout.hybrid=true, so every hybrid rank generates and trains as many "
                f"groups; set rollout.tasks_per_step to a multiple of {self.layout.trainer}"
            )
        shards = self.layout.rollout * self.layout.trainer  # split layouts; hybrid ranks' rule is checked above
        if not self.layout.hybrid and self.rollout.tasks_per_step % shards and self.rollout.dispatch == "static":
            raise ValueError(
                f"rollout.tasks_per_step={self.rollout.tasks_per_step} must be a multiple of "
                f"layout.rollout x layout.trainer = {self.layout.rollout} x {self.layout.trainer} = {shards}, "
                "so every rollout rank sends every trainer the same number of groups; "
                f"set rollout.tasks_per_step to a multiple of {shards} (or rollout.dispatch=dynamic)"
            )
        rc = self.rollout
        if rc.max_staleness and rc.dispatch == "dynamic" and self.layout.rollout > 1 and rc.engine.backend == "sglang":
            raise ValueError(
                f"rollout.dispatch=dynamic with rollout.max_staleness={rc.max_staleness} on {self.layout.rollout} "
                "rollout ranks needs each rank to take new weights in the middle of a step, and the sglang engine "
                "takes them only between steps: a rank taking them would wait for one still serving a step, which "
                "waits for it. Set rollout.dispatch=static, or rollout.max_staleness=0"
            )
        if self.reward.enabled and self.env.reward_fn:
            scorer = "reward.judge" if self.reward.judge is not None else "reward.model"
            raise ValueError(
                f"env.reward_fn={self.env.reward_fn} and {scorer} both score the episode; set one of them (a "
                "reward_fn may call a judge of its own)"
            )
        if self.rollout.max_new_tokens >= self.rollout.max_episode_tokens:
            raise ValueError(
                f"rollout.max_new_tokens={self.rollout.max_new_tokens} must be below "
                f"rollout.max_episode_tokens={self.rollout.max_episode_tokens}; raise the budget or lower the turn size"
            )
        if self.eval.n > 1 and self.eval.temperature == 0:
            raise ValueError(
                f"eval.n={self.eval.n} with eval.temperature=0 (greedy) would run the same episode {self.eval.n} "
                "times; set eval.temperature above 0 (e.g. 1.0) for pass@k, or eval.n=1"
            )
        if self.eval.split == "val" and not self.data.val:
            raise ValueError(
                "eval.split=val evaluates the rows of data.val, but data.val is not set; name a file of held-out "
                "rows (data.val=FILE.jsonl), or evaluate env seeds with eval.split=seeds"
            )
        if self.parallelism.fsdp and self.layout.trainer < 2:
            raise ValueError(
                "parallelism.fsdp=true needs at least 2 trainer ranks (layout.trainer); with one there is nothing "
                "to shard: set parallelism.fsdp=false (parallelism.mixed_precision=bf16 then uses autocast)"
            )
        if self.trainer.shared_prefix and (self.parallelism.fsdp or self.parallelism.activation_checkpointing):
            which = "parallelism.fsdp" if self.parallelism.fsdp else "parallelism.activation_checkpointing"
            raise ValueError(
                f"trainer.shared_prefix=true packs each group's prefix and its episodes' rests under a 4D attention "
                f"mask, which has not been tested with {which}=true; set {which}=false or trainer.shared_prefix=false"
            )
        engine = self.rollout.engine
        if self.layout.colocate and getattr(engine, "tp_size", 1) > 1:
            raise ValueError(
                "layout.colocate shares one trainer GPU per rollout rank, but "
                f"rollout.engine.tp_size={engine.tp_size}; set rollout.engine.tp_size=1 or layout.colocate=false"
            )
        if self.layout.hybrid:
            self._check_hybrid()
        if self.rollout.max_staleness and self.layout.colocate:
            raise ValueError(
                f"rollout.max_staleness={self.rollout.max_staleness} overlaps generation with training, but "
                "layout.colocate=true makes them take turns on one GPU; set rollout.max_staleness=0 or "
                "layout.colocate=false"
            )
        if self.agent.enabled and self.algorithm.name in TURN_LEVEL_ALGORITHMS:
            raise ValueError(
                f"algorithm.name={self.algorithm.name} needs env episodes turn by turn; agent programs (agent:) train "
                "with the episode-level algorithms (grpo, dr_grpo, dapo, rloo, reinforce_pp, gspo, cispo), or with "
                "turn_rloo on the per-turn rewards they post to /reward"
            )
        if self.layout.scorer and not self.reward.loads_a_model:
            raise ValueError(
                f"layout.scorer={self.layout.scorer} ranks serve a scoring model, but the run loads none; set "
                "reward.model.path or reward.judge.path, or layout.scorer=0"
                + (" (reward.judge.base_url's endpoint is the judge already)" if self.reward.judge is not None else "")
            )
        if self.layout.scorer and (self.policies or self.game is not None):
            raise ValueError(
                f"layout.scorer={self.layout.scorer}: scorer ranks serve single-policy runs only, and this config has "
                "policies; set layout.scorer=0"
            )
        if self.agent.service and self.layout.env:
            raise ValueError(
                f"layout.env={self.layout.env} ranks run agent programs (agent.command), but agent.service=true is a "
                "program of its own that claims the sessions; set layout.env=0"
            )
        self._note_async_correction()
        if self.chat.rewritten == "new_sample" and self.algorithm.name in TURN_LEVEL_ALGORITHMS:
            raise ValueError(
                f"chat.rewritten=new_sample splits an episode whose template rewrites it into samples, which "
                f"algorithm.name={self.algorithm.name} (turn-level) cannot score; set chat.rewritten=keep"
            )
        transport = self.weights.transport
        if self.policies or self.game is not None:
            from agentrl.config.policies import check_policies

            check_policies(self)
        if self.model.lora is not None:
            self._check_lora()
        # Whether cuda_ipc can serve is known once ranks have GPUs: weights.resolve_weight_sync checks it at start.
        if transport == "nccl" and self.layout.colocate:
            raise ValueError(
                "weights.transport=nccl cannot join a trainer and a rollout rank sharing a GPU (layout.colocate=true): "
                "NCCL needs one GPU per group member. Use weights.transport=cuda_ipc (one rollout rank) or mpi"
            )
        if self.weights.shm_in_place is True and (
            transport not in ("shm", "auto") or self.weights.shm_mapped is False or self.rollout.max_staleness
        ):
            raise ValueError(
                "weights.shm_in_place=true has the trainer train in the shared-memory window the engines view, which "
                f"needs weights.transport=shm (here {transport}), weights.shm_mapped not false (here "
                f"{self.weights.shm_mapped}) and lockstep rollouts, rollout.max_staleness=0 (here "
                f"{self.rollout.max_staleness}); change those or set weights.shm_in_place=auto"
            )
        if self.weights.shm_mapped is True and transport not in ("shm", "auto"):
            raise ValueError(
                f"weights.shm_mapped=true has engines view the shared-memory window, but weights.transport={transport} "
                "uses none; set weights.transport=shm (or auto on CPU), or leave weights.shm_mapped=auto"
            )
        return self

    def _check_hybrid(self) -> None:
        """layout.hybrid: what its ranks cannot also do."""
        refused = [
            (
                self.rollout.max_staleness > 0,
                f"rollout.max_staleness={self.rollout.max_staleness}",
                "generates and trains in turns on each rank, on-policy",
                "rollout.max_staleness=0, or separate trainer and rollout ranks (layout.hybrid=false)",
            ),
            (
                self.rollout.engine.backend != "torch",
                f"rollout.engine.backend={self.rollout.engine.backend}",
                "runs agentrl's torch engine inside each trainer process",
                "rollout.engine.backend=torch, or "
                "layout.hybrid=false with layout.colocate=true (SGLang rollout ranks on the trainers' GPUs)",
            ),
            (bool(self.policies), "policies:", "trains one policy", "layout.hybrid=false"),
            (
                self.weights.transport != "auto",
                f"weights.transport={self.weights.transport}",
                "copies each rank's weights into its own engine in-process",
                "weights.transport=auto",
            ),
            (
                self.rollout.dispatch == "dynamic",
                "rollout.dispatch=dynamic",
                "gives each rank a fixed share of the step's tasks",
                "rollout.dispatch=static",
            ),
        ]
        for bad, setting, what, fix in refused:
            if bad:
                raise ValueError(f"layout.hybrid=true {what}, but {setting}; set {fix}")

    def _check_lora(self) -> None:
        """LoRA needs what can take adapter-only syncs: the CPU transports, unsharded trainers."""
        if self.model.lora.modules_to_save and self.rollout.engine.backend == "sglang":
            raise ValueError(
                "model.lora.modules_to_save with rollout.engine.backend=sglang: SGLang's LoRA adapters take lora_A / "
                "lora_B only; set model.lora.modules_to_save=[] or rollout.engine.backend=torch"
            )
        if self.weights.transport not in ("auto", "shm", "mpi"):
            raise ValueError(
                f"model.lora sends only the adapters, over weights.transport=auto, shm or mpi (CPU); "
                f"weights.transport={self.weights.transport} cannot take them yet: set weights.transport=shm or mpi"
            )
        if self.weights.shm_in_place is True:
            raise ValueError(
                "model.lora with weights.shm_in_place=true: the trainer's adapters are not the engines' weights, so "
                "they cannot live in the window the engines view; set weights.shm_in_place=auto or false"
            )

    def _note_async_correction(self) -> None:
        """Asynchronous rollouts train on episodes of older weights (mu). With `algorithm.correction.mode=none`, the
        default, every algorithm's clipped ratio is pi / mu, against the rollout's own log-probs: the importance
        weight of the staleness, clipped, so each update stays near the weights that generated the episodes (PPO
        with the behaviour policy as the old one). The other modes take the ratio against the trainer's own
        log-probs before the update and weight it by pi_old / mu (decoupled PPO). With one optimizer update per step
        that ratio is 1, so nothing bounds an update: on the quickstart at max_staleness=2 a seed collapsed
        (docs/async.md)."""
        correction = getattr(self.algorithm, "correction", None)
        staleness = self.rollout.max_staleness
        if not staleness or correction is None:
            return
        if correction.mode == "none":
            self._notes.append(
                f"rollout.max_staleness={staleness}: the clipped ratio is taken against the rollout's own log-probs "
                "(algorithm.correction.mode=none): it weights the older weights' episodes and bounds each update"
            )
        elif self.trainer.updates_per_step == 1:
            self._notes.append(
                f"rollout.max_staleness={staleness} with algorithm.correction.mode={correction.mode}: the clipped "
                "ratio is taken against the trainer's own log-probs before the update, which "
                "trainer.updates_per_step=1 keeps at 1, so no clip bounds an update (docs/async.md); mode none "
                "clips against the rollout's own"
            )

    @property
    def notes(self) -> list[str]:
        return self._notes

    @property
    def trains_in_window(self) -> bool | str:
        """`weights.shm_in_place` as far as the config decides it: False running ahead, sharded (FSDP) or with
        LoRA (the trainer's adapters are not the engines' weights)."""
        if self.rollout.max_staleness or self.parallelism.fsdp or self.model.lora is not None:
            return False
        return self.weights.shm_in_place

    @property
    def maps_weights(self) -> bool | str:
        """`weights.shm_mapped` as far as the config decides it: False with LoRA (engines merge adapters into
        weights of their own, never view them)."""
        return False if self.model.lora is not None else self.weights.shm_mapped
