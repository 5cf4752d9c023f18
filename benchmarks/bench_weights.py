"""Weight sync, side by side: 400 MB of float32 weights from the trainer leader to 3 receivers.

Every receiver is a real torch engine that loads the weights into the parameters it owns.
One run measures, interleaved round by round (medians of --repeats):

- one memcpy of the whole weights (the floor of any copy), in this process;
- the receivers' own load: all receivers copy the weights from a private buffer into
  their engines at once (what every transport adds on top of moving the bytes);
- agentrl, each transport: shm (node-local shared memory; default bucket and one bucket;
  mapped: the engines view the window instead of copying from it; trained in place: the
  trainer's own parameters live in the window as well, so its optimizer's update is the
  write and a sync copies nothing), mpi (a broadcast to
  every rollout rank), gloo (the NCCL code path's process-group broadcast, buckets pipelined);
- a raw `comm.Bcast` of the same bytes (moving bytes only, no load);
- Ray's object store (`ray.put` by the trainer, `ray.get` + copy in 3 actors): the peers'
  transport, skipped with a message when ray is absent (`pip install -e .[bench]`); and
  zero-copy, the actors keeping the store's arrays as their weights (the like of mapped shm).

A trial's time runs from a barrier to the last receiver holding the new version. The
MPI cases run as one `mpirun -n RECEIVERS+1` job started by this script.

    python benchmarks/bench_weights.py            # 400 MB, 3 receivers, 5 repeats
    python benchmarks/bench_weights.py --mb 100 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
import zlib
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BUCKET_MB = 64.0


def model_config(total_mb: float, layers: int | None = None):
    """A Qwen2-shaped model (embeddings, lm head, decoder layers) of about `total_mb` MB of float32."""
    from transformers import Qwen2Config

    hidden, intermediate = 1024, 2816
    layer_bytes = 4 * (2 * hidden * hidden + 2 * hidden * hidden // 4 + 3 * hidden * intermediate)
    if layers is None:  # about a third of the bytes in decoder layers, the rest in embeddings and head
        layers = max(1, round(total_mb * 1e6 / 3 / layer_bytes))
    vocab = max(256, int((total_mb * 1e6 - layers * layer_bytes) / (2 * 4 * hidden)))
    return Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=16,
        num_key_value_heads=4,
        tie_word_embeddings=False,
    )


def build_model(total_mb: float, seed: int):
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(seed)
    with torch.no_grad():
        model = Qwen2ForCausalLM(model_config(total_mb))
        for p in model.parameters():  # skip HF's slow init distributions: any values will do
            p.uniform_(-1, 1)
    return model


def median(times: list[float]) -> float:
    return statistics.median(times)


# ---- the MPI job ---------------------------------------------------------------------


def checksum(model) -> int:
    crc = 0
    for p in model.parameters():
        crc = zlib.crc32(p.detach().contiguous().view(-1).view(torch.uint8).numpy(), crc)
    return crc


def run_mpi_part(args) -> None:
    from mpi4py import MPI

    from agentrl import transport
    from agentrl.engine.torch_engine import TorchEngine
    from agentrl.weights.mpi import MPIWeightBroadcast
    from agentrl.weights.nccl import DistributedWeightBroadcast
    from agentrl.weights.shm import SharedMemoryWeights

    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    is_trainer = rank == 0
    model = build_model(args.mb, seed=rank)
    named = [(name, p.detach()) for name, p in model.named_parameters()]
    nbytes = sum(t.numel() * t.element_size() for _, t in named)
    engine = None if is_trainer else TorchEngine(model, pad_token_id=0)
    in_place = "agentrl shm, mapped, trained in place"
    mapped = ["agentrl shm, mapped", "agentrl shm, mapped, 2 simulated nodes", in_place]
    placed = build_model(args.mb, seed=0) if is_trainer else None  # trained in place: its parameters move in
    engines = {}  # a mapped engine views its own window: one of its own, so the others copy into private memory
    if not is_trainer:
        engines = {method: TorchEngine(build_model(args.mb, seed=rank), pad_token_id=0) for method in mapped}
    flat = np.empty(nbytes, dtype=np.uint8)  # raw Bcast buffer; the receivers' private copy for "own load"
    if is_trainer:
        np.concatenate([t.contiguous().view(-1).view(torch.uint8).numpy() for _, t in named], out=flat)
    syncs = {
        "agentrl shm": SharedMemoryWeights(world, node=0, bucket_mb=args.bucket_mb, mapped=False),
        "agentrl shm, one bucket": SharedMemoryWeights(world, node=0, bucket_mb=2 * nbytes / 2**20, mapped=False),
        # ranks 0-1 and 2-3 as two nodes: one broadcast to rank 2, then node 1's window
        "agentrl shm, 2 simulated nodes": SharedMemoryWeights(
            world, node=rank // 2, bucket_mb=args.bucket_mb, mapped=False
        ),
        mapped[0]: SharedMemoryWeights(world, node=0, bucket_mb=args.bucket_mb, mapped=True),
        mapped[1]: SharedMemoryWeights(world, node=rank // 2, bucket_mb=args.bucket_mb, mapped=True),
        in_place: SharedMemoryWeights(world, node=0, bucket_mb=args.bucket_mb, mapped=True, in_place=True),
        "agentrl mpi": MPIWeightBroadcast(world, args.bucket_mb),
        "gloo process group": DistributedWeightBroadcast(world, args.bucket_mb, "gloo", "cpu", engine),
    }
    if not is_trainer:
        transport.bcast_array(world, flat, root=0)  # a receiver's private copy, for the own-load baseline
        own_copy = []
        offset = 0
        for name, tensor in named:
            size = tensor.numel() * tensor.element_size()
            own_copy.append(
                (name, torch.from_numpy(flat[offset : offset + size]).view(tensor.dtype).view(tensor.shape))
            )
            offset += size
    else:
        transport.bcast_array(world, flat, root=0)
        syncs[in_place].place(placed)
    version = 0

    def trainer_model(method: str):
        return placed if method == in_place else model

    def trial(method: str) -> float:
        nonlocal version
        version += 1
        world.Barrier()
        started = time.perf_counter()
        if method == "raw comm.Bcast (bytes only)":
            world.Bcast(flat, root=0)
        elif method == "receivers' own load":
            if not is_trainer:
                engine.load_weights(own_copy, version)
        elif is_trainer:
            syncs[method].send([(n, p.detach()) for n, p in trainer_model(method).named_parameters()], version)
        else:
            assert syncs[method].receive(engines.get(method, engine)) == version
        elapsed = time.perf_counter() - started
        return max(world.allgather(elapsed))

    methods = ["receivers' own load", "raw comm.Bcast (bytes only)", *syncs]
    times: dict[str, list[float]] = {method: [] for method in methods}
    verified = {}
    for _ in range(2):  # warm-up: windows allocated and both slots first touched, process-group buffers
        for method in syncs:
            trial(method)
    for _ in range(args.repeats):
        for method in methods:
            times[method].append(trial(method))
            if method in syncs:
                expected = world.bcast(checksum(trainer_model(method)) if is_trainer else None, root=0)
                held = trainer_model(method) if is_trainer else engines.get(method, engine).model
                verified[method] = all(world.allgather(checksum(held) == expected))
                if is_trainer:  # the next version differs everywhere (untimed, as an optimizer step is)
                    syncs[method].begin_update()
                    with torch.no_grad():
                        for p in trainer_model(method).parameters():
                            p.add_(1.0)
    for sync in syncs.values():
        if is_trainer:
            sync.stop()
        else:
            assert sync.receive(engine) is None
    if not is_trainer:
        assert not any(e.weights_mapped for e in engines.values()), "mapped weights left in a window"
    if is_trainer:
        Path(args.json).write_text(json.dumps({"times": times, "verified": verified, "nbytes": nbytes}))


# ---- Ray ------------------------------------------------------------------------------


def run_ray(args, shapes: list[tuple[int, ...]]) -> dict[str, list[float] | str]:
    """Two ways to hand Ray the weights: numpy arrays (read zero-copy from the store) and torch tensors,
    the state dict a trainer holds (pickled into the object and copied out again)."""
    try:
        import ray
    except ImportError:
        return {"Ray object store": "skipped: ray is not installed (pip install -e '.[bench]')"}
    nbytes = sum(4 * int(np.prod(s)) for s in shapes)
    ray.init(
        num_cpus=args.receivers + 1,
        include_dashboard=False,
        log_to_driver=False,
        object_store_memory=int(2.5 * nbytes) + 2**28,
    )

    @ray.remote
    class Receiver:
        def __init__(self, shapes):
            torch.set_num_threads(1)
            self.tensors = [torch.zeros(shape) for shape in shapes]

        def load(self, arrays) -> int:
            with torch.no_grad():
                for tensor, array in zip(self.tensors, arrays, strict=True):
                    tensor.copy_(torch.as_tensor(array))
            return zlib.crc32(self.tensors[-1].numpy())

        def view(self, arrays) -> int:
            """The store's read-only arrays become the weights themselves (kept, so the object stays pinned)."""
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # torch on non-writable arrays
                self.tensors = [torch.from_numpy(array) for array in arrays]
            return zlib.crc32(self.tensors[-1].numpy())

    try:
        receivers = [Receiver.remote(shapes) for _ in range(args.receivers)]
        rng = np.random.default_rng(0)
        arrays = [rng.random(shape, dtype=np.float32) for shape in shapes]
        tensors = [torch.from_numpy(a) for a in arrays]
        kinds = {  # name: (weights, what each receiver does with them)
            "Ray object store, numpy": (arrays, "load"),
            "Ray object store, torch": (tensors, "load"),
            "Ray object store, zero-copy": (arrays, "view"),
        }
        times: dict[str, list[float] | str] = {name: [] for name in kinds}
        for weights, use in kinds.values():
            ray.get([getattr(r, use).remote(weights) for r in receivers])  # warm-up
        for _ in range(args.repeats):
            for name, (weights, use) in kinds.items():  # interleaved, like the MPI cases
                arrays[-1] += 1  # a new version (the torch tensors share the arrays' memory)
                started = time.perf_counter()
                ref = ray.put(weights)
                crcs = ray.get([getattr(r, use).remote(ref) for r in receivers])
                times[name].append(time.perf_counter() - started)
                del ref
                assert set(crcs) == {zlib.crc32(arrays[-1])}, "a Ray receiver holds other weights"
        return times
    finally:
        ray.shutdown()


def memcpy_times(nbytes: int, repeats: int) -> list[float]:
    source = torch.ones(nbytes, dtype=torch.uint8)
    target = torch.zeros(nbytes, dtype=torch.uint8)
    target.copy_(source)  # first touch
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        target.copy_(source)
        times.append(time.perf_counter() - started)
    return times


def mpirun_command(n: int) -> list[str]:
    mpirun = shutil.which("mpirun", path=str(Path(sys.executable).parent)) or shutil.which("mpirun")
    if mpirun is None:
        raise SystemExit("mpirun not found: pip install mpich (or apt-get install openmpi-bin)")
    version = subprocess.run([mpirun, "--version"], capture_output=True, text=True).stdout
    return [mpirun, "-n", str(n), *(["--oversubscribe"] if "Open MPI" in version else [])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=400, help="weights in MB of float32 (default 400)")
    parser.add_argument("--receivers", type=int, default=3, help="rollout ranks receiving (default 3)")
    parser.add_argument("--repeats", type=int, default=5, help="trials per method; the median is reported")
    parser.add_argument("--bucket-mb", type=float, default=DEFAULT_BUCKET_MB, help="weights.bucket_mb (64)")
    parser.add_argument("--mpi-part", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mpi_part:
        from agentrl import transport

        transport.abort_on_exception(lambda: run_mpi_part(args))()
        return

    with torch.device("meta"):
        from transformers import Qwen2ForCausalLM

        shapes = [tuple(p.shape) for p in Qwen2ForCausalLM(model_config(args.mb)).parameters()]
    nbytes = sum(4 * int(np.prod(s)) for s in shapes)
    print(
        f"weights: {nbytes / 1e6:.0f} MB float32 in {len(shapes)} tensors, trainer leader -> {args.receivers} "
        f"receivers, medians of {args.repeats}, bucket {args.bucket_mb:g} MiB",
        flush=True,
    )
    times: dict[str, list[float] | str] = {"one memcpy": memcpy_times(nbytes, args.repeats)}
    with tempfile.TemporaryDirectory(prefix="bench_weights_") as folder:
        out = Path(folder) / "mpi.json"
        command = [*mpirun_command(args.receivers + 1), sys.executable, __file__, "--mpi-part", "--json", str(out)]
        command += ["--mb", str(args.mb), "--repeats", str(args.repeats), "--bucket-mb", str(args.bucket_mb)]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "TRANSFORMERS_VERBOSITY": "error"}
        subprocess.run(command, env=env, check=True)
        mpi = json.loads(out.read_text())
    times.update(mpi["times"])
    times.update(run_ray(args, shapes))
    print_table(times, mpi["verified"], nbytes)


def print_table(times: dict, verified: dict, nbytes: int) -> None:
    medians = {name: median(t) for name, t in times.items() if not isinstance(t, str)}
    memcpy = medians["one memcpy"]
    rays = {name: value for name, value in medians.items() if name.startswith("Ray")}
    ray = rays.get("Ray object store, numpy")  # Ray's fastest way to weights in tensors the receivers own
    floor = memcpy + medians["receivers' own load"]  # what no transport into owned tensors can beat
    print(f"\n{'method':<38} {'median s':>9} {'min s':>8} {'GB/s':>6} {'x memcpy':>9} {'Ray / this':>10}  exact")
    for name, value in times.items():
        if isinstance(value, str):
            print(f"{name:<38} {value}")
            continue
        med = medians[name]
        ratio_ray = f"{ray / med:10.2f}" if ray else f"{'-':>10}"
        exact = {True: "yes", False: "NO"}.get(verified.get(name), "")
        rate = nbytes / med / 1e9
        print(f"{name:<38} {med:9.3f} {min(value):8.3f} {rate:6.2f} {med / memcpy:9.1f} {ratio_ray}  {exact}")
    copying, mapped, in_place = "agentrl shm", "agentrl shm, mapped", "agentrl shm, mapped, trained in place"
    own = medians["receivers' own load"]
    print(f"\nfloor = memcpy + receivers' own load = {memcpy:.3f} + {own:.3f} = {floor:.3f} s")
    print(f"{copying} (copying: the default with one rollout rank per node): {medians[copying] / floor:.2f}x the floor")
    print(f"{mapped} (two or more per node, running ahead): {medians[mapped] / memcpy:.2f}x one memcpy")
    print(f"{in_place} (two or more per node, lockstep): {medians[in_place] / memcpy:.2f}x one memcpy")
    for name, value in rays.items():
        for ours in (copying, mapped, in_place):
            print(f"{name} / {ours} = {value / medians[ours]:.1f}x (goal >= 5)")
    print(f"agentrl mpi / {copying} = {medians['agentrl mpi'] / medians[copying]:.1f}x")


if __name__ == "__main__":
    main()
