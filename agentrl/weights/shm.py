"""Weights through node-local shared memory: written once per node, read by every rollout rank there.

The weight communicator (trainer leader + rollout ranks) is split by node. On each node
the first rank (the trainer leader on its own node) owns an MPI shared-memory window
(`MPI.Win.Allocate_shared`) of one or two slots; every other rank there maps the same
memory. Per bucket the node leader fills a slot (the trainer leader from its tensors,
gathering FSDP shards on the way; another node's leader by one broadcast over the
node leaders' communicator, received straight into its slot), then every rank on the
node copies the bucket from the slot into its engine. No message per receiver carries
weight bytes: one broadcast per bucket reaches one rank per node.

Handoff: two non-blocking barriers per bucket on the node communicator. `written(k)`
tells the readers slot k % slots holds bucket k; `read(k)` tells the node leader every
reader is done with it, and the leader waits for it only before it rewrites that slot
(two slots: filling bucket k+1 overlaps the readers' copies of bucket k). Barriers,
not a seqlock alone, because a sync is a rendezvous anyway (the rollout ranks are in
`receive` waiting for the header) and the writer must learn when a slot is free again,
which a version counter cannot tell it without a reader count of its own. On top, each
slot carries a seqlock stamp (sequence number, odd while being written; version;
bucket index) that a reader checks before and after its copy: a torn bucket raises
instead of loading silently.

A model that fits one bucket (weights.bucket_mb) goes in one slot and one round; a
larger one goes bucket by bucket through two slots, so a node holds at most two
buckets of shared memory on top of the engines' own weights.

Mapped (`weights.shm_mapped`): the window holds two whole versions, and every rollout
rank's engine takes its weights as views of the newest (`map_weights`): no copy per
rank, one copy of the weights per node however many rollout ranks share it. Version k
goes into slot k % 2; the `written` barrier as above; the second barrier, `switched`,
tells the node leader every engine now views the new slot, so the other one (the
version before) may be rewritten at the next sync. A reader checks, before it switches,
that the slot it generated from still carries the stamp it bound to.

In place (`weights.shm_in_place`, lockstep runs only): the trainer leader's parameters
themselves live in slot 0 of its node's window, so its optimizer writes each new version
there and a sync copies nothing on that node, only stamps and barriers. Lockstep makes it
safe: the trainer changes its weights only once every rollout rank has sent the step's
episodes, and a rollout rank generates again only after the next `written` barrier.
The stamp is odd from `begin_update` (before the optimizer step) to the next send.
"""

from __future__ import annotations

import numpy as np
import torch

from agentrl import transport
from agentrl.weights.base import TRANSFER_MAX_SLEEP_S, WeightSync, full_tensors, plan_buckets, spec_nbytes
from agentrl.weights.placement import maps_shared_weights

ALIGN = 64  # every tensor and slot starts on a cache line; any dtype is aligned there
STAMP_BYTES = ALIGN  # per slot: int64 sequence, version, bucket index (then padding)
HANDOFF_MAX_SLEEP_S = TRANSFER_MAX_SLEEP_S  # a barrier in the middle of a transfer ends soon: poll it closely


class TornWeights(RuntimeError):
    """A reader saw a slot that was being rewritten: a bug in the handoff, never expected."""


def aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def plan_layout(manifest, bucket_bytes: int) -> tuple[list[tuple[int, int]], list[int], int]:
    """(buckets, each tensor's byte offset inside its bucket's slot, slot capacity in bytes)."""
    sizes = [aligned(spec_nbytes(spec)) for spec in manifest]
    buckets = plan_buckets(sizes, bucket_bytes)
    offsets = [0] * len(sizes)
    capacity = 0
    for start, end in buckets:
        filled = 0
        for index in range(start, end):
            offsets[index] = filled
            filled += sizes[index]
        capacity = max(capacity, filled)
    return buckets, offsets, capacity


def pieces(nbytes: int, bucket_bytes: int) -> list[tuple[int, int]]:
    """Byte ranges of at most `bucket_bytes` covering [0, nbytes): one broadcast each across nodes."""
    return [(start, min(start + bucket_bytes, nbytes)) for start in range(0, nbytes, max(bucket_bytes, ALIGN))]


def mapped_layout(manifest) -> tuple[list[int], int]:
    """A mapped version: (each tensor's byte offset in its slot, slot capacity).

    Weights first, then biases, each in manifest order: projections an engine fuses into one matrix
    product (q/k/v, gate/up) then lie back to back, and so do their biases, so the fused tensor can be
    a view of the window too (`lean_decoder.stacked`).
    """
    order = sorted(range(len(manifest)), key=lambda index: manifest[index][0].endswith(".bias"))
    offsets, filled = [0] * len(manifest), 0
    for index in order:
        offsets[index] = filled
        filled += aligned(spec_nbytes(manifest[index]))
    return offsets, filled


class Slot:
    """One bucket's place in the window: a stamp then the bytes."""

    def __init__(self, memory: np.ndarray, start: int, capacity: int):
        self.stamp = memory[start : start + STAMP_BYTES].view(np.int64)
        self.payload = memory[start + STAMP_BYTES : start + STAMP_BYTES + capacity]
        self.tensor = torch.from_numpy(self.payload)

    @property
    def being_written(self) -> bool:
        return bool(self.stamp[0] % 2)

    def begin_write(self) -> None:
        self.stamp[0] += 1  # odd: being written

    def end_write(self, version: int, bucket: int) -> None:
        self.stamp[1:3] = (version, bucket)
        self.stamp[0] += 1  # even: complete

    def check(self, version: int, bucket: int, seen: int | None = None) -> int:
        """The slot's sequence number, once checked: it holds all of `bucket` of `version`, unchanged since `seen`."""
        sequence, stamped_version, stamped_bucket = (int(x) for x in self.stamp[:3])
        if sequence % 2 or (stamped_version, stamped_bucket) != (version, bucket) or seen not in (None, sequence):
            raise TornWeights(
                f"shared-memory slot holds bucket {stamped_bucket} of version {stamped_version} (sequence {sequence}"
                f"{', being written' if sequence % 2 else ''}) while a reader expected bucket {bucket} of version "
                f"{version}{f' unchanged since sequence {seen}' if seen is not None else ''}; this is a bug in "
                "agentrl's shared-memory handoff: please report it, and use weights.transport=mpi meanwhile"
            )
        return sequence


class SharedWindow:
    """`slots` slots of `capacity` bytes in one shared window of a node communicator (collective to create and free)."""

    def __init__(self, node_comm, slots: int, capacity: int):
        self.slots_count, self.capacity = slots, capacity
        self.win, memory = transport.allocate_shared(node_comm, slots * (STAMP_BYTES + capacity))
        self.slots = [Slot(memory, index * (STAMP_BYTES + capacity), capacity) for index in range(slots)]
        if node_comm.Get_rank() == 0:  # MPI does not zero a new window: stamps start as (0, 0, 0)
            for slot in self.slots:
                slot.stamp[:] = 0
        self.sync()
        transport.barrier(node_comm)
        self.sync()

    def holds(self, tensor: torch.Tensor) -> bool:
        start = self.slots[0].tensor.data_ptr()
        return start <= tensor.data_ptr() < start + self.slots_count * (STAMP_BYTES + self.capacity)

    def fits(self, slots: int, capacity: int) -> bool:
        return self.slots_count >= slots and self.capacity >= capacity

    def sync(self) -> None:
        """Memory barrier between this process's view of the window and the other processes' writes."""
        self.win.Sync()

    def free(self) -> None:
        transport.free_shared(self.win)


class SharedMemoryWeights(WeightSync):
    """`weights.transport=shm`: every rank of `weight_comm` (trainer leader = rank 0) builds one.

    `node` tells which ranks share memory: equal on ranks of one node (the layout's node
    index, or a simulated node under AGENTRL_RANKS_PER_NODE). The node and node-leader
    communicators are split at the first send/receive, after a polled barrier: whoever comes
    first (the trainer, whose header broadcast returns at once, or a rollout rank) sleeps
    instead of spinning in the split.
    """

    def __init__(
        self, weight_comm, node: int, bucket_mb: float, mapped: bool | str = "auto", in_place: bool | str = False
    ):
        if mapped not in ("auto", True, False):
            raise ValueError(f"mapped={mapped!r}: expected 'auto', True or False")
        if in_place not in ("auto", True, False):
            raise ValueError(f"in_place={in_place!r}: expected 'auto', True or False")
        self.comm = weight_comm
        self.node = node
        self.bucket_bytes = int(bucket_mb * 2**20)
        self.mapped_choice = mapped
        self.mapped: bool | None = None  # decided at the split, the same on every rank
        self.versions_moved = 0  # mapped: version number k of this sync goes into slot k % 2
        self.bound: tuple[int, int, int] | None = None  # reader: (slot, version, sequence) its engine views
        self.mapped_engine = None  # reader: the engine whose parameters view the window
        self.in_place_choice = in_place
        self.placed_model = None  # trainer leader: the model whose parameters may live in the window
        self.in_place: bool | None = None  # decided at the first send, the same on every rank
        self.node_comm = None
        self.leaders_comm = None  # one rank per node; None on the other ranks
        self.window: SharedWindow | None = None
        self.pending: list = []  # barriers this rank started and has not completed
        self.slot_free: dict[int, object] = {}  # node leader: slot -> the `read` barrier to finish before rewriting
        self.progress: transport.BackgroundProgress | None = None  # trainer leader: `pending` completing meanwhile

    # ---- communicators and the window -------------------------------------------------

    def _split(self) -> None:
        from mpi4py import MPI

        rank = self.comm.Get_rank()
        transport.barrier(self.comm)
        self.node_comm = self.comm.Split(color=self.node, key=rank)
        is_leader = self.node_comm.Get_rank() == 0
        self.leaders_comm = self.comm.Split(color=0 if is_leader else MPI.UNDEFINED, key=rank)
        if rank == 0 and not is_leader:
            raise RuntimeError("the trainer leader must lead its node's shared-memory window")
        rollout_nodes = self.comm.allgather(self.node)[1:]  # rank 0 is the trainer leader
        self.mapped = maps_shared_weights(self.mapped_choice, rollout_nodes)

    def _check_in_place(self) -> None:
        """In place needs mapped weights: the engines must view the slot the trainer trains in."""
        if self.in_place and not self.mapped:
            if self.in_place_choice is True and self.comm.Get_rank() == 0:
                raise RuntimeError(
                    "weights.shm_in_place=true needs mapped weights, but they are copied here (one rollout rank on "
                    "the trainer's node, or weights.shm_mapped=false); set weights.shm_in_place=auto or false"
                )
            self.in_place = False

    @property
    def is_node_leader(self) -> bool:
        return self.node_comm.Get_rank() == 0

    def paces_sender(self) -> bool:
        """Only a node leader away from the trainer's node: the trainer broadcasts each bucket to it. On the trainer's
        node the trainer starts its barriers and goes on (before the first sync: not known yet)."""
        return self.node_comm is None or (self.is_node_leader and self.comm.Get_rank() != 0)

    def _window_for(self, slots: int, capacity: int) -> SharedWindow:
        if self.window is None or not self.window.fits(slots, capacity):
            if self.window is not None:
                self._unplace()
                self.window.free()
            self.window = SharedWindow(self.node_comm, slots, capacity)
        return self.window

    def _finish_pending(self) -> None:
        if self.progress is not None:
            self.progress.finish()
            self.progress = None
        for request in self.pending:
            transport.wait(request, what="a shared-memory weight handoff", max_sleep_s=HANDOFF_MAX_SLEEP_S)
        self.pending.clear()
        self.slot_free.clear()

    def _own_weights(self) -> None:
        """Reader: its engine copies its parameters out of the window (before the window is freed or written)."""
        if self.mapped_engine is not None:
            self.mapped_engine.own_weights()
        self.mapped_engine, self.bound = None, None

    def _unplace(self) -> None:
        """Trainer leader: its parameters move out of the window into memory of their own (before it is freed)."""
        if self.placed_model is not None and self.window is not None:
            with torch.no_grad():
                for param in self.placed_model.parameters():
                    if self.window.holds(param):
                        param.data = param.data.clone()

    def _close(self) -> None:
        self._finish_pending()
        self._own_weights()
        self._unplace()
        if self.window is not None:
            self.window.free()
            self.window = None

    # ---- one version ------------------------------------------------------------------

    def _transfer(self, header: dict, named_tensors=None, engine=None) -> None:
        """Every node fills its slots bucket by bucket; every rollout rank loads each bucket into `engine`."""
        if self.mapped:
            self._transfer_mapped(header, named_tensors, engine)
            return
        manifest = header["manifest"]
        buckets, offsets, capacity = plan_layout(manifest, self.bucket_bytes)
        self._finish_pending()  # the trainer leader: the last version's readers, done during its training step
        window = self._window_for(1 if len(buckets) == 1 else 2, capacity)
        node_size = self.node_comm.Get_size()
        if engine is not None:
            engine.begin_weight_update()
        for bucket, (start, end) in enumerate(buckets):
            slot = window.slots[bucket % window.slots_count]
            used = offsets[end - 1] + aligned(spec_nbytes(manifest[end - 1]))
            if self.is_node_leader:
                self._fill(slot, bucket, header["version"], named_tensors, start, end, offsets, used)
            if node_size > 1:
                self._written(window)
            if engine is not None:
                seen = slot.check(header["version"], bucket)
                engine.load_weight_bucket(self._views(slot, manifest, offsets, start, end))
                window.sync()
                slot.check(header["version"], bucket, seen)
            if node_size > 1:
                done_reading = self.node_comm.Ibarrier()
                self.pending.append(done_reading)
                if self.is_node_leader:
                    self.slot_free[bucket % window.slots_count] = done_reading
        if engine is not None:
            engine.end_weight_update(header["version"])
            self._finish_pending()  # a reader's barriers are done once its node leader got this far

    def _fill(self, slot: Slot, bucket: int, version: int, named_tensors, start, end, offsets, used) -> None:
        """Node leader: wait until the slot's last readers are done, then write (or receive) bucket `bucket`."""
        previous = self.slot_free.pop(bucket % self.window.slots_count, None)
        if previous is not None:
            transport.wait(previous, what="readers of a weight slot", max_sleep_s=HANDOFF_MAX_SLEEP_S)
        if not slot.being_written:  # else begin_update marked it: the trainer trains in it
            slot.begin_write()
            self.window.sync()
        if named_tensors is not None:  # the trainer leader: gather (FSDP) one tensor at a time and copy it in
            for index, (_, tensor) in zip(range(start, end), full_tensors(named_tensors[start:end]), strict=True):
                flat = tensor.detach().contiguous().view(-1).view(torch.uint8)
                target = slot.tensor[offsets[index] : offsets[index] + flat.numel()]
                if flat.data_ptr() != target.data_ptr():  # else trained in place: already there
                    target.copy_(flat)
                del tensor, flat  # a gathered tensor is freed before the next one is gathered
        if self.leaders_comm is not None and self.leaders_comm.Get_size() > 1:
            for first, last in pieces(used, self.bucket_bytes):
                transport.bcast_array(
                    self.leaders_comm, slot.payload[first:last], root=0, max_sleep_s=HANDOFF_MAX_SLEEP_S
                )
        slot.end_write(version, bucket)
        self.window.sync()

    def _written(self, window: SharedWindow) -> None:
        """The `written` barrier: the node leader starts it and goes on; a reader waits for it."""
        written = self.node_comm.Ibarrier()
        if self.is_node_leader:
            self.pending.append(written)
        else:
            transport.wait(written, what="a shared-memory weight bucket", max_sleep_s=HANDOFF_MAX_SLEEP_S)
            window.sync()

    def _transfer_mapped(self, header: dict, named_tensors=None, engine=None) -> None:
        """The node leader writes the whole version into the slot not in use; every engine then views it."""
        manifest, version = header["manifest"], header["version"]
        offsets, capacity = mapped_layout(manifest)
        self._finish_pending()  # every engine views the last version: the slot before it is free
        slots = 1 if self.in_place else 2  # in place (lockstep): nothing reads while the next version is written
        if self.window is not None and not self.window.fits(slots, capacity):
            self._own_weights()
        window = self._window_for(slots, capacity)
        index = 0 if self.in_place else self.versions_moved % 2
        self.versions_moved += 1
        slot = window.slots[index]
        if self.is_node_leader:  # the whole version as one bucket (gathers in manifest order, as FSDP needs)
            self._fill(slot, 0, version, named_tensors, 0, len(manifest), offsets, capacity)
            if self.in_place and named_tensors is not None:
                self._place_in(slot, manifest, offsets)
        if self.node_comm.Get_size() > 1:
            self._written(window)
        if engine is not None:
            self._switch(engine, window, index, version, manifest, offsets)
        if self.node_comm.Get_size() > 1:
            self.pending.append(self.node_comm.Ibarrier())  # switched: the other slot is free
        if engine is not None:
            self._finish_pending()

    def _switch(self, engine, window: SharedWindow, index: int, version: int, manifest, offsets) -> None:
        """Reader: check the slot it generated from was left alone, then view (or copy) the new version."""
        if self.bound is not None and not self.in_place:  # in place, the trainer trained in the slot meanwhile
            bound_index, bound_version, sequence = self.bound
            window.slots[bound_index].check(bound_version, 0, sequence)
        slot = window.slots[index]
        seen = slot.check(version, 0)
        views = self._views(slot, manifest, offsets, 0, len(manifest))
        if engine.map_weights(views, version):
            self.mapped_engine, self.bound = engine, (index, version, seen)
            return
        self._own_weights()  # a copy must not land in the window an engine viewed
        engine.begin_weight_update()
        engine.load_weight_bucket(views)
        engine.end_weight_update(version)
        window.sync()
        slot.check(version, 0, seen)

    def _place_in(self, slot: Slot, manifest, offsets) -> None:
        """Trainer leader: each parameter becomes its view of the slot (same values: the slot was just filled).
        `_decide_in_place` checked that the manifest lists the model's parameters in order."""
        views = self._views(slot, manifest, offsets, 0, len(manifest))
        with torch.no_grad():
            for param, (_, view) in zip(self.placed_model.parameters(), views, strict=True):
                if param.data_ptr() != view.data_ptr():
                    param.data = view

    def _decide_in_place(self, named_tensors) -> bool:
        """Trainer leader: whether its parameters can live in the window (whole CPU tensors, sent as they are)."""
        if self.in_place_choice is False or self.placed_model is None:
            if self.in_place_choice is True:
                raise RuntimeError("weights.shm_in_place=true, but the trainer gave the weight sync no model to place")
            return False
        params = list(self.placed_model.named_parameters())
        why = None
        if [name for name, _ in params] != [name for name, _ in named_tensors]:
            why = "the weights sent are not the model's parameters in order"
        elif any(hasattr(p, "full_tensor") or p.device.type != "cpu" or not p.is_contiguous() for _, p in params):
            why = "the trainer's parameters are sharded (FSDP), not on the CPU, or not contiguous"
        if why and self.in_place_choice is True:
            raise RuntimeError(f"weights.shm_in_place=true, but {why}; set weights.shm_in_place=auto or false")
        return why is None

    # ---- WeightSync -------------------------------------------------------------------

    def place(self, model) -> None:
        self.placed_model = model

    def begin_update(self) -> None:
        """Trainer leader, in place: the slot its optimizer writes is marked as being written until the next send."""
        if self.in_place and self.window is not None and self.window.holds(next(self.placed_model.parameters())):
            self._finish_pending()  # done already: every rollout rank switched before it generated this step
            self.window.slots[0].begin_write()
            self.window.sync()

    @staticmethod
    def _views(slot: Slot, manifest, offsets, start: int, end: int) -> list[tuple[str, torch.Tensor]]:
        views = []
        for index in range(start, end):
            name, shape, dtype = manifest[index]
            raw = slot.tensor[offsets[index] : offsets[index] + spec_nbytes(manifest[index])]
            views.append((name, raw.view(getattr(torch, dtype)).view(shape)))
        return views

    # ---- WeightSync -------------------------------------------------------------------

    def send(self, named_tensors, version: int) -> None:
        """Trainer leader: returns once every bucket is in its node's window and sent to the other nodes.

        The rollout ranks may still be copying the last buckets: the next send waits for them
        before it rewrites a slot, so the trainer's next step overlaps their loading.
        """
        named_tensors = list(named_tensors)
        manifest = [(name, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for name, t in named_tensors]
        if self.in_place is None:
            self.in_place = self._decide_in_place(named_tensors)
        header = {"stop": False, "version": version, "manifest": manifest, "in_place": self.in_place}
        transport.bcast_object(self.comm, header, root=0)
        if self.node_comm is None:
            self._split()
            self._check_in_place()
            if self.in_place:
                print(
                    "agentrl: the trainer's parameters live in its node's shared-memory window: its optimizer "
                    "writes each version where the engines there view it (weights.shm_in_place)",
                    flush=True,
                )
        self._transfer(header, named_tensors=named_tensors)
        # The readers' barriers need this rank's part: keep it going while the trainer trains, or
        # a rollout rank loading these weights waits for the trainer's next step (rollout.max_staleness).
        self.progress = transport.BackgroundProgress(self.pending)

    def stop(self) -> None:
        transport.bcast_object(self.comm, {"stop": True}, root=0)
        if self.node_comm is not None:
            self._close()

    def receive(self, engine) -> int | None:
        header = transport.bcast_object(self.comm, None, root=0)
        if header["stop"]:
            if self.node_comm is not None:
                self._close()
            return None
        if self.node_comm is None:
            self.in_place = header["in_place"]
            self._split()
            self._check_in_place()
        self._transfer(header, engine=engine)
        return header["version"]
