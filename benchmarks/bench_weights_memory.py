"""Node memory of shared-memory weights: engines viewing the window (mapped), the trainer training in
it as well (in place, lockstep), against engines copying from it.

One `mpirun -n RECEIVERS+1` job per mode: the trainer leader sends three versions of a
Qwen2-shaped model to torch engines on one node, each engine then reads every weight (as
generating does), and every rank reports its proportional set size (PSS: private pages,
plus shared pages divided among the processes mapping them), so the sum over the ranks is
what the node holds.

    python benchmarks/bench_weights_memory.py            # 400 MB, 3 receivers
    python benchmarks/bench_weights_memory.py --mb 100 --receivers 7
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from bench_weights import build_model, mpirun_command  # noqa: E402

FIELDS = ("Pss", "Pss_Anon", "Pss_Shmem")


def memory_mb() -> dict[str, float]:
    """This process's PSS and its anonymous and shared-memory parts, in MB, from /proc/self/smaps_rollup."""
    sizes = {}
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        key = line.split(":")[0]
        if key in FIELDS:
            sizes[key] = int(line.split()[1]) / 1024
    return sizes


def run_mpi_part(args) -> None:
    from mpi4py import MPI

    from agentrl.engine.torch_engine import TorchEngine
    from agentrl.weights.shm import SharedMemoryWeights

    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    model = build_model(args.mb, seed=rank)
    engine = TorchEngine(model, pad_token_id=0) if rank else None
    mapped, in_place = args.mapped in ("on", "inplace"), args.mapped == "inplace"
    sync = SharedMemoryWeights(world, node=0, bucket_mb=args.bucket_mb, mapped=mapped, in_place=in_place)
    if rank == 0:
        sync.place(model)
    else:
        del model
    for version in range(1, 4):
        if rank == 0:
            if version > 1:  # the optimizer's step, where the trainer's parameters live
                sync.begin_update()
                with torch.no_grad():
                    for p in model.parameters():
                        p.add_(1.0)
            sync.send([(name, p.detach()) for name, p in model.named_parameters()], version)
        else:
            assert sync.receive(engine) == version
        world.Barrier()  # lockstep: the engines are done with a version before the trainer changes it
    gc.collect()
    if rank:
        sum(float(p.sum()) for p in engine.model.parameters())  # every weight read, as generating does
    sizes = world.gather(memory_mb(), root=0)
    if rank == 0:
        sync.stop()
        Path(args.json).write_text(json.dumps(sizes))
    else:
        assert sync.receive(engine) is None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=400, help="weights in MB of float32 (default 400)")
    parser.add_argument("--receivers", type=int, default=3, help="rollout ranks on the node (default 3)")
    parser.add_argument("--bucket-mb", type=float, default=64.0, help="weights.bucket_mb (64)")
    parser.add_argument("--mapped", choices=["inplace", "on", "off"], help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mapped:
        from agentrl import transport

        transport.abort_on_exception(lambda: run_mpi_part(args))()
        return
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench_weights_memory_") as folder:
        for mapped in ("inplace", "on", "off"):
            out = Path(folder) / f"{mapped}.json"
            command = [*mpirun_command(args.receivers + 1), sys.executable, __file__, "--mapped", mapped]
            command += ["--json", str(out), "--mb", str(args.mb), "--bucket-mb", str(args.bucket_mb)]
            env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "TRANSFORMERS_VERBOSITY": "error"}
            subprocess.run(command, env=env, check=True)
            results[mapped] = json.loads(out.read_text())
    print(f"\nweights: {args.mb:g} MB float32, trainer leader + {args.receivers} engines on one node; PSS in MB")
    print(f"{'mode':<11} {'rank':<14} {'PSS':>7} {'private':>8} {'shared':>7}")
    for mapped, sizes in results.items():
        for name, size in (("trainer", sizes[0]), ("engine (most)", max(sizes[1:], key=lambda s: s["Pss"]))):
            print(f"{mapped:<11} {name:<14} {size['Pss']:7.0f} {size['Pss_Anon']:8.0f} {size['Pss_Shmem']:7.0f}")
        print(f"{mapped:<11} {'node total':<14} {sum(s['Pss'] for s in sizes):7.0f}")
    totals = {mapped: sum(s["Pss"] for s in sizes) for mapped, sizes in results.items()}
    saved_mapped, saved_in_place = totals["off"] - totals["on"], totals["off"] - totals["inplace"]
    print(f"against copying, mapped saves {saved_mapped:.0f} MB on this node, in place {saved_in_place:.0f} MB")


if __name__ == "__main__":
    main()
