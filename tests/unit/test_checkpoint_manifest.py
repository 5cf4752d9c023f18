"""Checkpoint manifests: a damaged newest checkpoint is named and skipped; pruning never loses the good one."""

import json
from types import SimpleNamespace

import torch

from agentrl.models.loading import load_causal_lm, load_tokenizer
from agentrl.trainer import checkpoint


def save(run_dir, step, model, tokenizer, keep=5):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    trained = SimpleNamespace(model=model, optimizer=optimizer, scheduler=scheduler)
    return checkpoint.save(run_dir, step, trained, tokenizer, keep)


def truncate(path):
    with path.open("r+b") as handle:
        handle.truncate(path.stat().st_size // 2)


def test_manifest_lists_every_file_and_is_written_last(tmp_path, tiny_model_dir):
    model, tokenizer = load_causal_lm(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    path = save(tmp_path, 4, model, tokenizer)
    manifest = json.loads((path / checkpoint.MANIFEST_FILE).read_text())
    assert manifest["step"] == 4
    on_disk = {p.name for p in path.iterdir()} - {checkpoint.MANIFEST_FILE}
    assert set(manifest["files"]) == on_disk and {"model.safetensors", "trainer_state.pt"} <= on_disk
    assert all(len(entry["sha256"]) == 64 for entry in manifest["files"].values())
    assert checkpoint.check(4, path).problem is None


def test_damaged_newest_checkpoints_are_skipped_and_named(tmp_path, tiny_model_dir):
    model, tokenizer = load_causal_lm(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    for step in (2, 4, 6):
        save(tmp_path, step, model, tokenizer)
    truncate(checkpoint.step_path(tmp_path, 6) / "model.safetensors")
    truncate(checkpoint.step_path(tmp_path, 4) / "trainer_state.pt")
    found, damaged = checkpoint.newest_complete(tmp_path)
    assert found.step == 2
    assert [(bad.step, bad.problem.split(" is ")[0]) for bad in damaged] == [
        (6, "model.safetensors"),
        (4, "trainer_state.pt"),
    ]
    assert "bytes, its manifest says" in damaged[0].problem
    assert checkpoint.latest(tmp_path) == (2, checkpoint.step_path(tmp_path, 2))
    assert checkpoint.step_path(tmp_path, 6).is_dir()  # skipped, not deleted


def test_a_flipped_byte_fails_the_checksum(tmp_path, tiny_model_dir):
    model, tokenizer = load_causal_lm(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    path = save(tmp_path, 1, model, tokenizer)
    weights = path / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    assert checkpoint.check(1, path).problem == "model.safetensors does not match the sha256 in its manifest"


def test_checkpoints_without_a_manifest_are_used_when_they_load(tmp_path, tiny_model_dir):
    model, tokenizer = load_causal_lm(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    old = save(tmp_path, 3, model, tokenizer)
    (old / checkpoint.MANIFEST_FILE).unlink()  # as written before manifests existed
    checked = checkpoint.check(3, old)
    assert checked.problem is None and "has no manifest.json" in checked.note
    truncate(old / "model.safetensors")
    assert "does not load" in checkpoint.check(3, old).problem
    (old / checkpoint.STATE_FILE).unlink()
    assert "never finished" in checkpoint.check(3, old).problem


def test_prune_keeps_the_newest_and_leaves_skipped_ones_above(tmp_path, tiny_model_dir):
    model, tokenizer = load_causal_lm(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    for step in (1, 2, 9):
        save(tmp_path, step, model, tokenizer)
    truncate(checkpoint.step_path(tmp_path, 9) / "model.safetensors")  # resume skips it and starts at 2
    (checkpoint.checkpoint_dir(tmp_path) / "step_000002.tmp").mkdir()  # a save cut short by a kill
    save(tmp_path, 3, model, tokenizer, keep=1)
    names = sorted(p.name for p in checkpoint.checkpoint_dir(tmp_path).iterdir())
    assert names == ["step_000003", "step_000009"]  # the damaged newer one stays until step 9 is saved again
    save(tmp_path, 9, model, tokenizer, keep=1)
    assert checkpoint.latest(tmp_path)[0] == 9
    assert [p.name for p in checkpoint.checkpoint_dir(tmp_path).iterdir()] == ["step_000009"]
