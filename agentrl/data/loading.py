"""Rows from a file, a saved folder or the hub, loaded with Hugging Face `datasets`.

data.train: launch/data/arith_train.jsonl     # .jsonl / .json, .parquet
data.train: runs/my_rows                      # a folder written by Dataset.save_to_disk
data.train: openai/gsm8k:train                # a hub dataset id, `name` or `name:split` (online)
"""

from __future__ import annotations

from pathlib import Path

from agentrl.errors import UserError

FILE_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


def load_rows(spec: str, field: str = "data.train"):
    """The `datasets.Dataset` that `spec` names; a UserError naming `field` and the path when it names none."""
    import datasets

    datasets.disable_progress_bars()  # one bar per rank per load would flood the job's output
    path = Path(spec)
    if path.is_dir():
        return _load_saved(path, field)
    if path.is_file():
        return _load_file(path, field)
    if path.suffix.lower() in FILE_FORMATS or spec.startswith((".", "/", "~")) or spec.count("/") > 1:
        raise UserError(
            f"{field}={spec!r}: no such file or folder (looked in {Path.cwd()}); fix the path, or give a "
            "hub dataset id such as `name` or `name:split`"
        )
    return _load_hub(spec, field)


def _load_file(path: Path, field: str):
    import datasets

    kind = FILE_FORMATS.get(path.suffix.lower())
    if kind is None:
        raise UserError(
            f"{field}={str(path)!r} is a {path.suffix or 'suffix-less'} file; agentrl reads .jsonl, .json and "
            ".parquet files, or a folder written by `datasets.Dataset.save_to_disk`"
        )
    try:
        return datasets.load_dataset(kind, data_files=str(path), split="train")
    except Exception as error:  # a parse error in the user's file: say which file and what
        raise UserError(f"{field}={str(path)!r} cannot be read as {path.suffix} rows: {_first_line(error)}") from None


def _load_saved(path: Path, field: str):
    import datasets

    try:
        loaded = datasets.load_from_disk(str(path))
    except FileNotFoundError as error:
        raise UserError(
            f"{field}={str(path)!r} is a folder, but not one written by `datasets.save_to_disk` "
            f"({_first_line(error)}); name a .jsonl or .parquet file or a saved dataset folder"
        ) from None
    if isinstance(loaded, datasets.DatasetDict):
        splits = ", ".join(loaded)
        raise UserError(
            f"{field}={str(path)!r} holds several splits ({splits}); name one split's folder, "
            f"for example {path / next(iter(loaded))}"
        )
    return loaded


def _load_hub(spec: str, field: str):
    import datasets

    name, _, split = spec.partition(":")
    try:
        return datasets.load_dataset(name, split=split or "train")
    except Exception as error:  # offline, a wrong id or split: the user fixes the spec
        raise UserError(
            f"{field}={spec!r} is not a file or folder here, and loading it as the hub dataset {name!r} "
            f"(split {split or 'train'!r}) failed: {_first_line(error)}. Fix the path, or the id and split "
            "(`name:split`); the hub needs network access"
        ) from None


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"
