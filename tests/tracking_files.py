"""Reading back what the W&B and MLflow backends wrote, for tests: an offline W&B run folder and an MLflow store.

W&B's run file (`run-<id>.wandb`) is a log of protobuf `Record`s in 32 KiB blocks, after a 7-byte header
(`:W&B`, 0xBEE1, version 0). Each piece of a record has a 7-byte header: CRC-32 of its type byte and data
(4 bytes, little-endian), data length (2 bytes), type (1 full, 2 first, 3 middle, 4 last); a block's last
bytes, too few for a header, are padding. The Python reader W&B once shipped is gone from its newer releases,
so this one checks every CRC and follows the pieces itself.
"""

from __future__ import annotations

import json
import math
import struct
import zlib
from pathlib import Path

BLOCK = 32 * 1024
FILE_HEADER = b":W&B" + struct.pack("<HB", 0xBEE1, 0)
PIECE_HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def wandb_records(run_file: Path) -> list:
    """Every record of a `.wandb` file, parsed with W&B's own protobuf classes."""
    from wandb.proto import wandb_internal_pb2

    raw = Path(run_file).read_bytes()
    assert raw.startswith(FILE_HEADER), f"{run_file} does not start with the W&B header"
    records, pending, position = [], None, len(FILE_HEADER)
    while position < len(raw):
        left_in_block = BLOCK - position % BLOCK
        if left_in_block < PIECE_HEADER:
            position += left_in_block
            continue
        if position + PIECE_HEADER > len(raw):
            break
        crc, length, kind = struct.unpack("<IHB", raw[position : position + PIECE_HEADER])
        data = raw[position + PIECE_HEADER : position + PIECE_HEADER + length]
        if kind == 0 and length == 0:  # zeros at the end of a block the writer had not filled
            position += left_in_block
            continue
        assert zlib.crc32(bytes([kind]) + data) == crc, f"{run_file}: bad CRC at byte {position}"
        position += PIECE_HEADER + length
        if kind == FULL:
            whole = data
        elif kind == FIRST:
            pending = bytearray(data)
            continue
        elif kind == MIDDLE:
            pending += data
            continue
        else:
            assert kind == LAST, f"{run_file}: piece type {kind} at byte {position}"
            whole, pending = bytes(pending + data), None
        record = wandb_internal_pb2.Record()
        record.ParseFromString(whole)
        records.append(record)
    return records


def wandb_run_folder(run_dir: Path) -> Path:
    """The single offline run folder W&B wrote under run_dir/wandb."""
    folders = sorted((Path(run_dir) / "wandb").glob("offline-run-*"))
    assert len(folders) == 1, f"expected one offline W&B run in {run_dir}/wandb, found {folders}"
    return folders[0]


def _put(into: dict, item) -> None:
    """A history or config item into a dict: `nested_key` [a, b] (a table's fields) as into[a][b]."""
    path = list(item.nested_key) or [item.key]
    for part in path[:-1]:
        into = into.setdefault(part, {})
    into[path[-1]] = json.loads(item.value_json)


class WandbRun:
    """What an offline run folder holds: the run's identity, its config, its history rows by step."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        (run_file,) = self.folder.glob("run-*.wandb")
        self.records = wandb_records(run_file)
        runs = [r.run for r in self.records if r.WhichOneof("record_type") == "run"]
        assert runs, f"{run_file} has no run record"
        self.run = runs[0]
        self.config: dict = {}
        for update in [self.run.config.update] + [
            r.config.update for r in self.records if r.WhichOneof("record_type") == "config"
        ]:
            for item in update:
                _put(self.config, item)
        self.rows: dict[int, dict] = {}  # step -> {key: value}
        for record in self.records:
            if record.WhichOneof("record_type") == "history":
                row: dict = {}
                for item in record.history.item:
                    _put(row, item)
                self.rows.setdefault(row.get("_step", record.history.step.num), {}).update(row)

    def scalars(self) -> dict[str, list[tuple[int, float]]]:
        """{name: [(step, value), ...]} of the numeric history keys (W&B's own `_...` keys left out)."""
        found: dict[str, list[tuple[int, float]]] = {}
        for step in sorted(self.rows):
            for key, value in self.rows[step].items():
                if not key.startswith("_") and isinstance(value, (int, float)) and not isinstance(value, bool):
                    found.setdefault(key, []).append((step, float(value)))
        return found

    def table(self, step: int, key: str) -> dict:
        """The table logged as `key` at `step`, read from its file under files/."""
        entry = self.rows[step][key]
        assert entry["_type"] == "table-file", entry
        return json.loads((self.folder / "files" / entry["path"]).read_text())


def mlflow_scalars(tracking_uri: str, run_id: str) -> dict[str, list[tuple[int, float]]]:
    """{name: [(step, value), ...]} of every metric of an MLflow run, in step order (a step logged twice, by a
    resumed run: in the order logged)."""
    from agentrl.tracking.mlflow_run import client as mlflow_client

    client = mlflow_client(tracking_uri)
    names = client.get_run(run_id).data.metrics
    found = {}
    for name in sorted(names):
        history = sorted(client.get_metric_history(run_id, name), key=lambda m: (m.step, m.timestamp))
        found[name] = [(m.step, m.value) for m in history]
    return found


def same(left: list[tuple[int, float]], right: list[tuple[int, float]]) -> bool:
    """Equal (step, value) lists, NaN equal to NaN, values equal to float32 precision (TensorBoard stores those)."""
    if [step for step, _ in left] != [step for step, _ in right]:
        return False
    return all(
        (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-7)
        for (_, a), (_, b) in zip(left, right, strict=True)
    )
