"""A tiny Qwen2-shaped model and a tokenizer trained locally: no hub, no downloads.

The quickstart and the tests build one, save it with `save_pretrained`, and load it
back with `from_pretrained`, so they exercise the same loading path as a real model.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

# Tool results as Qwen2.5 renders them: a run of `tool` messages is one user turn of <tool_response> blocks (what
# ToolEnv's observations and the SFT transcripts hold, so a model sees one format through an env or the gateway).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}<|im_start|>user{% endif %}"
    "{{ '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}<|im_end|>\n{% endif %}"
    "{% else %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Qwen2's pre-tokenizer split: AutoTokenizer rebuilds a Qwen2 tokenizer with it from
# vocab and merges, so training must split text the same way.
QWEN2_PRETOKENIZE_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""  # noqa: E501
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# The role names CHAT_TEMPLATE writes after <|im_start|> (a tool message is rendered as a user turn).
CHAT_ROLES = ["user", "assistant", "system"]


def build_tokenizer(texts: Iterable[str], vocab_size: int = 160):
    """Train a small byte-level BPE tokenizer on `texts` (the pre-tokenizer Qwen2 uses).

    The base alphabet is only the bytes that occur in `texts`, so the vocabulary stays
    small; digits stay single tokens, as in Qwen2's regex. Every message the model reads or writes opens with
    its role's name, so the corpus holds one role header per text: "user" and "assistant" then become single
    tokens where the vocabulary has room, instead of being spelled out letter by letter in every turn.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = list(texts)
    texts += [f"{CHAT_ROLES[i % len(CHAT_ROLES)]}\n" for i in range(max(len(texts), len(CHAT_ROLES)))]
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    seen = {ch for text in [*texts, "0123456789 \n"] for word, _ in byte_level.pre_tokenize_str(text) for ch in word}
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated"), byte_level]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, initial_alphabet=sorted(seen), show_progress=False
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
        chat_template=CHAT_TEMPLATE,
    )


@dataclass(frozen=True)
class TinyShape:
    """A tiny model's size and initialisation; the config's `model.tiny` section has the same fields and serves as
    well."""

    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    vocab_size: int = 160
    seed: int = 0
    init_std: float = 0.02
    output_scale: float = 1.0


def build_tiny_model(out_dir: str | os.PathLike, texts: Iterable[str], shape: TinyShape | None = None) -> Path:
    """Write a randomly initialised Qwen2 causal LM of `shape` (default `TinyShape()`) and its tokenizer to
    `out_dir`."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    shape = shape or TinyShape()
    hidden_size, num_layers, num_heads = shape.hidden_size, shape.num_layers, shape.num_heads
    vocab_size, seed, init_std, output_scale = shape.vocab_size, shape.seed, shape.init_std, shape.output_scale
    out_dir = Path(out_dir)
    tokenizer = build_tokenizer(texts, vocab_size=vocab_size)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=max(1, num_heads // 2),
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        initializer_range=init_std,
        bos_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        model.model.norm.weight.fill_(output_scale)
    return save_model_folder(model, tokenizer, out_dir)


def save_model_folder(model, tokenizer, out_dir: Path) -> Path:
    """Write the model and tokenizer under a temporary name, then rename it to `out_dir` at once: a reader never sees
    half a folder, and a concurrent builder (a sweep's other trial) that finished first wins."""
    tmp = out_dir.with_name(out_dir.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    try:
        os.replace(tmp, out_dir)
    except OSError:
        if not (out_dir / "config.json").is_file():
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir
