"""Tiny models in real chat formats: per family, a tokenizer with the family's special tokens and a chat template
written after its published one (agentrl/models/chat_templates/), and a tiny random model of the family's
architecture. No hub, no downloads: the tokenizer is trained locally as agentrl/models/tiny.py trains its own.

    build_family_model("qwen3", out_dir, texts)   # a folder `from_pretrained` and `load_codec` both read
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from agentrl.models.tiny import QWEN2_PRETOKENIZE_REGEX, TinyShape, save_model_folder

TEMPLATES = Path(__file__).with_name("chat_templates")
# Words every format writes (roles, call fields, channel names), so each is a token or two, not a dozen bytes.
FORMAT_WORDS = (
    "system user assistant tool ipython developer function functions name arguments parameters type json "
    'commentary analysis final content call_id {"name": "arguments": "parameters": "content": } ] ['
)


@dataclass(frozen=True)
class Fixture:
    """One family's test model: `special`: control tokens (special, skipped by skip_special_tokens); `added`:
    markup tokens that are not special (Qwen's <tool_call>, <think>); `architecture`: the transformers
    model_type of its tiny model."""

    template: str
    special: tuple[str, ...]
    eos: str
    pad: str
    architecture: str
    bos: str | None = None
    added: tuple[str, ...] = ()
    config: dict = field(default_factory=dict)
    every_head_has_keys: bool = False  # no grouped-query attention (DeepSeek's multi-head latent attention)


QWEN_SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
QWEN_MARKUP = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
DEEPSEEK_SPECIAL = (
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<｜▁pad▁｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁outputs▁begin｜>",
    "<｜tool▁outputs▁end｜>",
    "<｜tool▁output▁begin｜>",
    "<｜tool▁output▁end｜>",
)
MOE = {"n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1, "first_k_dense_replace": 1}
DEEPSEEK_CONFIG = {
    **MOE,
    "n_group": 1,
    "topk_group": 1,
    "kv_lora_rank": 16,
    "q_lora_rank": 32,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 16,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}

FIXTURES: dict[str, Fixture] = {
    "hermes": Fixture("hermes", QWEN_SPECIAL, "<|im_end|>", "<|endoftext|>", "qwen2", added=QWEN_MARKUP),
    "qwen3": Fixture(
        "qwen3", QWEN_SPECIAL, "<|im_end|>", "<|endoftext|>", "qwen3", added=(*QWEN_MARKUP, "<think>", "</think>")
    ),
    "llama3": Fixture(
        "llama3",
        (
            "<|begin_of_text|>",
            "<|end_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
            "<|eom_id|>",
            "<|python_tag|>",
            "<|finetune_right_pad_id|>",
        ),
        "<|eot_id|>",
        "<|finetune_right_pad_id|>",
        "llama",
        bos="<|begin_of_text|>",
    ),
    "mistral": Fixture(
        "mistral",
        (
            "<unk>",
            "<s>",
            "</s>",
            "[INST]",
            "[/INST]",
            "[TOOL_CALLS]",
            "[AVAILABLE_TOOLS]",
            "[/AVAILABLE_TOOLS]",
            "[TOOL_RESULTS]",
            "[/TOOL_RESULTS]",
        ),
        "</s>",
        "<unk>",
        "mistral",
        bos="<s>",
        config={"sliding_window": None},
    ),
    "harmony": Fixture(
        "harmony",
        (
            "<|startoftext|>",
            "<|endoftext|>",
            "<|start|>",
            "<|end|>",
            "<|message|>",
            "<|channel|>",
            "<|constrain|>",
            "<|return|>",
            "<|call|>",
        ),
        "<|return|>",
        "<|endoftext|>",
        "gpt_oss",
        config={"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 128},
    ),
    "deepseek_v3": Fixture(
        "deepseek_v3",
        DEEPSEEK_SPECIAL,
        "<｜end▁of▁sentence｜>",
        "<｜▁pad▁｜>",
        "deepseek_v3",
        bos="<｜begin▁of▁sentence｜>",
        added=("<think>", "</think>"),
        config=DEEPSEEK_CONFIG,
        every_head_has_keys=True,
    ),
    "glm45": Fixture(
        "glm45",
        ("<|endoftext|>", "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"),
        "<|endoftext|>",
        "<|endoftext|>",
        "glm4_moe",
        added=(
            "<think>",
            "</think>",
            "<tool_call>",
            "</tool_call>",
            "<arg_key>",
            "</arg_key>",
            "<arg_value>",
            "</arg_value>",
            "<tool_response>",
            "</tool_response>",
        ),
        config={**MOE, "n_group": 1, "topk_group": 1},
    ),
}
FIXTURES["deepseek_r1"] = replace(FIXTURES["deepseek_v3"], template="deepseek_r1")  # the same model, R1's template


def chat_template(family: str) -> str:
    return (TEMPLATES / f"{fixture(family).template}.jinja").read_text()


def fixture(family: str) -> Fixture:
    try:
        return FIXTURES[family]
    except KeyError:
        raise KeyError(f"no test model for chat format {family!r}; families with one: {', '.join(FIXTURES)}") from None


def build_family_tokenizer(family: str, texts: Iterable[str] = (), vocab_size: int = 512):
    """A byte-level BPE tokenizer trained on `texts` (and the format's common words) with `family`'s special and
    markup tokens, its eos/pad/bos, and its chat template. The plain text the template writes around every
    conversation (Llama 3's dated system header) is trained on as often as a quarter of `texts`, so that it costs a
    few tokens, not one a character."""
    texts = [*texts, FORMAT_WORDS]
    first = _trained_tokenizer(family, texts, vocab_size)
    frame = first.apply_chat_template([{"role": "user", "content": " "}], tokenize=False, add_generation_prompt=True)
    spec = fixture(family)
    for token in sorted((*spec.special, *spec.added), key=len, reverse=True):
        frame = frame.replace(token, "\n")
    if not frame.strip():
        return first
    return _trained_tokenizer(family, [*texts, *[frame] * max(1, len(texts) // 4)], vocab_size)


def _trained_tokenizer(family: str, texts: list[str], vocab_size: int):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    spec = fixture(family)
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated"), byte_level]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(spec.special),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte: any text round-trips
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    tokenizer.add_tokens([AddedToken(token, special=False, normalized=False) for token in spec.added])
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=spec.bos,
        eos_token=spec.eos,
        pad_token=spec.pad,
        chat_template=chat_template(family),
        clean_up_tokenization_spaces=False,
    )


def tiny_config(family: str, vocab_size: int, hidden_size: int = 32, num_layers: int = 2, num_heads: int = 4):
    """A tiny transformers config of `family`'s architecture (MoE families with 4 small experts)."""
    from transformers import AutoConfig

    spec = fixture(family)
    head_dim = hidden_size // num_heads
    settings = {
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": 4 * hidden_size,
        "moe_intermediate_size": hidden_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_heads if spec.every_head_has_keys else max(1, num_heads // 2),
        "head_dim": head_dim,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
    }
    return AutoConfig.for_model(spec.architecture, **{**settings, **spec.config})


FAMILY_SHAPE = TinyShape(hidden_size=32, vocab_size=512)  # the test fixtures' size


def build_family_model(
    family: str, out_dir: str | os.PathLike, texts: Iterable[str] = (), shape: TinyShape = FAMILY_SHAPE
) -> Path:
    """Write a randomly initialised tiny model of `family`'s architecture and its tokenizer to `out_dir`, of
    `shape` (agentrl.models.tiny.TinyShape; the config's `model.tiny` fields)."""
    import torch
    from transformers import AutoModelForCausalLM

    out_dir = Path(out_dir)
    tokenizer = build_family_tokenizer(family, texts, shape.vocab_size)
    config = tiny_config(family, len(tokenizer), shape.hidden_size, shape.num_layers, shape.num_heads)
    config.bos_token_id = tokenizer.bos_token_id
    config.eos_token_id = tokenizer.eos_token_id
    config.pad_token_id = tokenizer.pad_token_id
    config.initializer_range = shape.init_std
    torch.manual_seed(shape.seed)
    model = AutoModelForCausalLM.from_config(config)
    if shape.output_scale != 1.0:
        with torch.no_grad():
            model.model.norm.weight.fill_(shape.output_scale)
    return save_model_folder(model, tokenizer, out_dir)
