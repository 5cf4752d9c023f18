"""Transcript files: read with Hugging Face `datasets`, checked line by line, tokenized into a packed batch.

The file is loaded with the `text` builder (one row per line) and each line parsed as JSON
here: that keeps every transcript exactly as written (the `json` builder would merge the
argument schemas of different tools into one Arrow struct, adding null arguments), and it
lets every error name the file and the line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agentrl.errors import UserError
from agentrl.models.chat_format import tools_as_text
from agentrl.sft.transcripts import REASONING_KEYS, TranscriptError, TranscriptTokenizer, episode_shape


@dataclass
class Transcript:
    messages: list[dict]
    tools: list[dict] | None
    where: str  # "FILE:LINE", for errors


def read_lines(path: str | Path) -> list[str]:
    """The file's lines, through `datasets` (blank lines kept, so index + 1 is the line number)."""
    import datasets

    path = Path(path)
    if not path.is_file():
        raise UserError(f"transcript file {path} does not exist; check the path (sft.train / sft.val)")
    datasets.disable_progress_bars()
    dataset = datasets.load_dataset("text", data_files=str(path), split="train", keep_in_memory=True)
    return list(dataset["text"])


def read_transcripts(path: str | Path) -> list[Transcript]:
    """Every transcript of a JSONL file, with its roles checked; a UserError names the file and line of a bad one."""
    transcripts = []
    for index, line in enumerate(read_lines(path)):
        if not line.strip():
            continue
        where = f"{path}:{index + 1}"
        transcripts.append(parse_line(line, where))
    if not transcripts:
        raise UserError(f"transcript file {path} holds no transcript; write one JSON object per line")
    return transcripts


def parse_line(line: str, where: str) -> Transcript:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as error:
        raise UserError(
            f"{where}: not valid JSON ({error.msg} at column {error.colno}); each line must be one JSON object "
            'such as {"messages": [{"role": "user", "content": ...}, {"role": "assistant", "content": ...}]}'
        ) from None
    if not isinstance(row, dict) or "messages" not in row:
        keys = ", ".join(row) if isinstance(row, dict) else type(row).__name__
        raise UserError(
            f'{where}: no "messages" key (found: {keys or "nothing"}); each line must hold '
            '{"messages": [...]} in the Hugging Face chat format'
        )
    tools = row.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise UserError(f'{where}: "tools" must be a list of function specs ({{"type": "function", ...}})')
    try:
        episode_shape(row["messages"])
    except TranscriptError as error:
        raise UserError(f"{where}: {error}") from None
    return Transcript(row["messages"], tools or None, where)


def texts_of(transcripts: list[Transcript]) -> list[str]:
    """Every text a transcript puts in the token stream: the corpus of a tiny tokenizer built for them."""
    texts = []
    for transcript in transcripts:
        shape = episode_shape(transcript.messages)
        texts += [text for text in (shape.system, shape.first) if text]
        for text, observation in shape.turns:
            texts += [text, *([observation] if observation else [])]
        texts += [m[key] for m in transcript.messages for key in REASONING_KEYS if isinstance(m.get(key), str)]
        if transcript.tools:
            texts.append(tools_as_text(transcript.tools))
    return texts


@dataclass
class Packed:
    """Transcripts as flat token and mask arrays with offsets (a transcript is tokens[offsets[i]:offsets[i+1]])."""

    tokens: np.ndarray
    loss_mask: np.ndarray
    offsets: np.ndarray
    truncated: int  # transcripts cut at max_seq_len
    dropped: int  # transcripts with no assistant token left after the cut

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def rows(self, indices) -> list[tuple[np.ndarray, np.ndarray]]:
        return [
            (self.tokens[self.offsets[i] : self.offsets[i + 1]], self.loss_mask[self.offsets[i] : self.offsets[i + 1]])
            for i in indices
        ]


def tokenize_all(transcripts: list[Transcript], tokenizer: TranscriptTokenizer, max_seq_len: int) -> Packed:
    tokens, masks, lengths = [], [], []
    truncated = dropped = 0
    for transcript in transcripts:
        try:
            out = tokenizer(transcript.messages, transcript.tools)
        except (TranscriptError, ValueError) as error:
            raise UserError(f"{transcript.where}: {error}") from None
        ids, mask = out.tokens, out.loss_mask
        if len(ids) > max_seq_len:
            truncated += 1
            ids, mask = ids[:max_seq_len], mask[:max_seq_len]
        if not any(mask[1:]):  # the first token is never predicted
            dropped += 1
            continue
        tokens += ids
        masks += mask
        lengths.append(len(ids))
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return Packed(np.asarray(tokens, dtype=np.int32), np.asarray(masks, dtype=np.int8), offsets, truncated, dropped)


def describe_packed(packed: Packed, name: str, max_seq_len: int) -> str:
    """One line for the log: how many transcripts and tokens, and how many the length limit cut or dropped."""
    trained = int(packed.loss_mask.sum())
    line = f"{name}: {len(packed)} transcripts, {len(packed.tokens)} tokens ({trained} trained)"
    if packed.truncated:
        line += f"; {packed.truncated} cut at sft.max_seq_len={max_seq_len}"
    if packed.dropped:
        line += f", {packed.dropped} of them dropped (no assistant token left; raise sft.max_seq_len)"
    return line
