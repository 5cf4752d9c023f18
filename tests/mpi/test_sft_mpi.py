"""`mpirun -n 2 agentrl sft`: dumped episodes -> transcripts -> two data-parallel ranks; the loss falls, the result
is a Hugging Face folder that RL trains from; a stopped run resumes to the same weights as an uninterrupted one."""

import json
import signal
import subprocess
import sys

import pytest
import torch

from agentrl.run.preempt import EXIT_STOPPED
from agentrl.trainer import checkpoint
from tests.conftest import ROOT, mpirun_command
from tests.mpi.helpers import (
    assert_ok,
    finish,
    job_env,
    mpirun,
    on_cpu_below_gpus,
    rank_command,
    scalars,
    small_run,
    train,
    wait_for,
)

pytestmark = pytest.mark.mpi

STEPS = 16  # 2 epochs x 8 batches of 4 transcripts


def guess_episode(seed: int, success: bool) -> dict:
    """A dumped guess_number episode: a wrong guess, then the secret (or another wrong one)."""
    from envs.guess_number.env import GuessNumberEnv

    env = GuessNumberEnv()
    observation, info = env.reset(seed=seed)
    wrong = [g for g in range(1, 11) if g != info["secret"]]
    messages = [{"role": "user", "content": observation}]
    for guess in [wrong[0], info["secret"] if success else wrong[1]]:
        messages.append({"role": "assistant", "content": str(guess)})
        reply, reward, terminated, _, _ = env.step(str(guess))
        messages.append({"role": "user", "content": reply})
    finish_reason = "terminated" if terminated else "max_turns"
    return {
        "task_id": seed,
        "step": 0,
        "weight_version": 0,
        "reward": reward,
        "success": success,
        "finish": finish_reason,
        "turns": 2,
        "messages": messages,
    }


def write_dumps(folder):
    folder.mkdir(parents=True)
    for step in range(2):
        for rank in range(2):
            seeds = range(step * 20 + rank * 10, step * 20 + rank * 10 + 10)
            lines = [json.dumps(guess_episode(seed, success=seed % 5 != 0)) for seed in seeds]
            (folder / f"step_{step:06d}.rank{rank}.jsonl").write_text("\n".join(lines) + "\n")


def sft_args(tmp_path, run, **extra) -> list[str]:
    settings = {
        "run_dir": run,
        "model.path": tmp_path / "model",
        "model.tiny": "{hidden_size: 32, num_layers: 2, num_heads: 4, vocab_size: 96}",
        "sft.train": tmp_path / "train.jsonl",
        "sft.val": tmp_path / "train.jsonl",
        "sft.epochs": 2,
        "sft.batch_size": 4,
        "sft.micro_batch_size": 2,
        "sft.eval_every": 8,
        "optimizer.lr": 0.003,
        "checkpoint.every": 2,
        "logging.progress": "false",
        **extra,
    }
    return ["-m", "agentrl.cli", "sft", str(ROOT / "launch/configs/sft_example.yaml")] + [
        f"{key}={value}" for key, value in settings.items()
    ]


def weights(folder):
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def test_rejection_sampling_sft_on_two_ranks_then_rl(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentrl.sft.data import read_transcripts
    from agentrl.sft.episodes import episodes_to_sft

    write_dumps(tmp_path / "episodes")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "agentrl.cli",
            "episodes-to-sft",
            str(tmp_path / "episodes"),
            str(tmp_path / "train.jsonl"),
        ],
        cwd=ROOT,
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert_ok(result)
    assert "kept 32 of 40 episodes from 4 file(s) (skipped: 8 not successful)" in result.stdout
    kept = [json.loads(line) for line in (tmp_path / "train.jsonl").read_text().splitlines()]
    assert len(kept) == 32 and all(row["reward"] == 1.0 for row in kept)

    run = tmp_path / "sft"
    result = mpirun(2, sft_args(tmp_path, run), timeout=600)
    assert_ok(result)
    assert "ranks=2 steps=16" in result.stdout and f"model         {run / 'final'}" in result.stdout
    logged = scalars(run)
    loss = [value for _, value in sorted(logged["sft/loss"])]
    assert [step for step, _ in sorted(logged["sft/loss"])] == list(range(STEPS))
    assert sum(loss[-3:]) < 0.8 * sum(loss[:3]), loss
    val = [value for _, value in sorted(logged["sft/val_loss"])]
    assert len(val) == 2 and val[1] < val[0]
    assert all(value > 0 for _, value in logged["sft/tokens"]) and "sft/lr" in logged and "sft/grad_norm" in logged

    final = run / "final"
    model = AutoModelForCausalLM.from_pretrained(final)
    tokenizer = AutoTokenizer.from_pretrained(final)
    assert tokenizer.chat_template and model.config.vocab_size >= len(tokenizer)
    assert torch.equal(
        weights(final)["model.norm.weight"], weights(checkpoint.step_path(run, STEPS))["model.norm.weight"]
    )

    rl = tmp_path / "rl"
    assert_ok(train(2, small_run(rl, final, steps=2, **{"rollout.dump_episodes": "true"})))
    assert sorted(step for step, _ in scalars(rl / "run")["episode/count"]) == [0, 1]
    # The RL run's own dumps are SFT data again (every episode, successful or not, with --all).
    report = episodes_to_sft(rl / "run" / "episodes", rl / "all.jsonl", success_only=False)
    assert report.episodes == 2 * 4 * 4 and report.kept == report.episodes - report.failed
    assert len(read_transcripts(rl / "all.jsonl")) == report.kept

    # The same run, stopped by a signal at its first step boundary and resumed: the same steps, the same weights.
    resumed = tmp_path / "resumed"
    command = [*mpirun_command(2), *rank_command(), *sft_args(tmp_path, resumed)]
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        env=job_env(),
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(lambda: (resumed / "config.yaml").exists(), 300, process, "config.yaml")  # signal handlers are set
    process.send_signal(signal.SIGUSR1)  # mpirun forwards it to both ranks
    out, err = finish(process, 120, "the stopped sft run")
    assert process.returncode == EXIT_STOPPED, f"exit {process.returncode}\n{out}\n{err[-4000:]}"
    stopped_at = checkpoint.latest(resumed)[0]
    assert stopped_at == 1 and "resume=true" in out
    assert not (resumed / "final").exists()
    assert_ok(mpirun(2, sft_args(tmp_path, resumed, resume="true"), timeout=600))
    assert [step for step, _ in sorted(scalars(resumed)["sft/loss"])] == list(range(STEPS))
    expected, got = weights(final), weights(resumed / "final")
    assert all(torch.equal(expected[name], got[name]) for name in expected), "resume changed the result"


def test_fsdp_matches_replicated_ranks(tmp_path, monkeypatch):
    """parallelism.fsdp=true shards the model over the two ranks and trains to the weights the replicas reach."""
    on_cpu_below_gpus(2, monkeypatch)
    from agentrl.sft.episodes import episodes_to_sft

    write_dumps(tmp_path / "episodes")
    episodes_to_sft(tmp_path / "episodes", tmp_path / "train.jsonl")
    short = {"sft.epochs": 1, "sft.batch_size": 8, "sft.micro_batch_size": 3, "checkpoint.every": 0}
    for name, fsdp in (("replicated", "false"), ("fsdp", "true")):
        result = mpirun(2, sft_args(tmp_path, tmp_path / name, **short, **{"parallelism.fsdp": fsdp}), timeout=600)
        assert_ok(result)
    replicated, sharded = weights(tmp_path / "replicated" / "final"), weights(tmp_path / "fsdp" / "final")
    tied = set(sharded) - set(replicated)  # the gathered FSDP state also lists the tied output embedding
    assert tied <= {"lm_head.weight"} and set(replicated) <= set(sharded)
    for key in tied:
        assert torch.equal(sharded[key], sharded["model.embed_tokens.weight"])
    for key in replicated:
        torch.testing.assert_close(sharded[key], replicated[key], rtol=1e-4, atol=1e-5, msg=key)
    first = weights(tmp_path / "model")
    assert any(not torch.equal(first[key], replicated[key]) for key in first)  # it trained
