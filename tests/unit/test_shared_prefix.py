"""`trainer.shared_prefix`: forwarding each group's shared prefix once gives the whole-row path's logits, loss and
gradients, up to float32 rounding.

Batches: groups of 1 and of 8, one-turn (a prompt, then 1-4 generated tokens) and multi-turn (a prompt, then turns
of generated tokens, eos and an observation), prompts of different lengths per group, and groups whose episodes
also share their first reply (the shared prefix then reaches into trained tokens). Two trainers load the same
weights, one with the option and one without, and train one step on the same batch; their metrics and their
gradients (kept after the step, clipped alike) must agree.

Tolerance: float32 sums in another order. Gradients: |a - b| <= 1e-5 x max|b| + 1e-7 per tensor (measured: under
1e-6 relative); loss and the other metrics: 1e-5 relative.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from agentrl.config import from_dict
from agentrl.roles.trainer_parts import policy_trainer
from agentrl.trainer import shared_prefix
from agentrl.trainer.lean_forward import LeanForward
from agentrl.trainer.policy_trainer import _rows
from agentrl.trajectory import Episode, num_episodes, pack
from tests.conftest import ROOT
from tests.mpi.helpers import QUICKSTART, assert_ok, scalars, small_run

ROLLOUT = {"max_new_tokens": 4, "max_turns": 3, "max_episode_tokens": 64, "temperature": 0.9, "group_size": 8}


def make_batch(turns: int, group_size: int, groups: int = 4, seed: int = 0) -> dict[str, np.ndarray]:
    """`groups` groups of `group_size` episodes; group g's prompt is 4 + 3g tokens; odd groups also share their first
    reply (and, multi-turn, its observation); logprobs near the model's, so the clip is inert."""
    rng = np.random.default_rng(seed)
    episodes = []
    for group in range(groups):
        prompt = rng.integers(3, 90, size=4 + 3 * group)
        first_reply = rng.integers(3, 90, size=2)
        for member in range(group_size):
            episode = Episode(group=group, task_seed=group)
            episode.extend(prompt, mask=0)
            for turn in range(turns):
                shared = group % 2 == 1 and turn == 0
                reply = first_reply if shared else rng.integers(3, 90, size=int(rng.integers(1, 5)))
                start = len(episode.tokens)
                episode.extend(reply, mask=1, logprobs=rng.normal(-3.0, 0.1, size=len(reply)))
                episode.turn_spans.append((start, len(episode.tokens)))
                episode.turn_rewards.append(0.0)
                episode.turn_states.append(turn)
                if turns > 1:
                    episode.extend([2], mask=0)
                    episode.extend(rng.integers(3, 90, size=2 if shared else int(rng.integers(1, 4))), mask=0)
            episode.reward = float(rng.normal()) + member * 0.1
            episodes.append(episode)
    order = rng.permutation(len(episodes))  # a group's episodes need not be next to each other
    return pack([episodes[i] for i in order])


def trainer_for(model_dir, shared: bool, micro: int, algorithm=None, lora=None):
    config = from_dict(
        {
            "model": {"path": str(model_dir), "lora": lora},
            "algorithm": {"name": "grpo", **(algorithm or {})},
            "rollout": ROLLOUT,
            "trainer": {"micro_batch_size": micro, "shared_prefix": shared},
            "optimizer": {"lr": 1e-3},
        }
    )
    return policy_trainer(config, str(model_dir), "cpu")


def assert_close_gradients(got: torch.nn.Module, want: torch.nn.Module) -> None:
    for (name, a), (_, b) in zip(got.named_parameters(), want.named_parameters(), strict=True):
        if b.grad is None:
            assert a.grad is None, name
            continue
        scale = float(b.grad.abs().max())
        diff = float((a.grad - b.grad).abs().max())
        assert diff <= 1e-5 * scale + 1e-7, f"{name}: gradients differ by {diff} (largest {scale})"


GLOBAL_BASELINE = {"name": "reinforce_pp"}  # groups of one: a batch-wide baseline, so advantages are not all 0
CASES = [  # (turns, group size, micro-batch size, algorithm options, model.lora, layouts plan may take)
    (1, 8, 32, {}, None, None),
    (3, 8, 32, {}, None, None),
    (3, 8, 32, {}, None, ("packed",)),
    (3, 8, 32, {}, None, ("cached",)),
    (3, 8, 32, {}, None, ("tree",)),
    (1, 8, 32, {}, None, ("tree",)),
    (3, 8, 12, {}, None, None),  # micro-batches that split groups
    (1, 1, 32, GLOBAL_BASELINE, None, None),
    (3, 1, 32, GLOBAL_BASELINE, None, None),
    (3, 8, 32, {"kl_coef": 0.1}, None, ("packed",)),  # the frozen reference's forward shares the prefixes too
    (3, 8, 32, {"kl_coef": 0.1}, None, ("cached",)),
    (3, 8, 32, {"kl_coef": 0.1}, None, ("tree",)),
    (3, 8, 16, {"correction": {"mode": "tis"}}, None, None),  # the old policy's log-probs recomputed, sharing them
    (3, 8, 32, {}, {"rank": 4, "alpha": 8}, ("packed",)),  # PEFT's wrapper
    (3, 8, 32, {}, {"rank": 4, "alpha": 8}, ("cached",)),
    (3, 8, 32, {}, {"rank": 4, "alpha": 8}, ("tree",)),
]


# the same cases by the model's own forward (two passes for the cached layout), not the lean forward
FORWARD_CASES = [case for case in CASES if case[-1] is not None]


@pytest.mark.parametrize(
    ("turns", "group_size", "micro", "options", "lora", "layouts", "lean"),
    [(*case, True) for case in CASES] + [(*case, False) for case in FORWARD_CASES],
)
def test_one_step_equals_whole_rows(tiny_model_dir, turns, group_size, micro, options, lora, layouts, lean):
    batch = make_batch(turns, group_size)
    trainers = {}
    metrics = {}
    for shared in (True, False):
        torch.manual_seed(0)
        trainers[shared] = trainer_for(tiny_model_dir, shared, micro, options, lora)
        assert all(forward is not None for forward in trainers[shared].lean_forwards.values())
        if not (shared and lean):  # whole rows by the model's own forward: the reference the lean one must meet
            trainers[shared].lean_forwards = {}
        if shared and layouts:
            trainers[shared].prefix_layouts = layouts
            if layouts == ("tree",):  # these random rows share little beyond the prompt: the tree, priced, loses
                trainers[shared].pair_cost = 0.0
        if options.get("kl_coef"):  # move the policy off the reference, so the KL term has a gradient
            with torch.no_grad():
                for param in trainers[shared].params:
                    param.add_(0.05 * torch.randn_like(param))
        metrics[shared] = trainers[shared].train_step(batch)
    assert metrics[False]["train/grad_norm"] > 1e-3  # a gradient to compare
    assert_close_gradients(trainers[True].model, trainers[False].model)
    computed = metrics[True].pop("train/shared_prefix_positions")
    assert (computed < 0.8) if group_size > 1 else computed <= 1.0  # groups of one: at most rows packed together
    assert set(metrics[True]) == set(metrics[False])
    for key, want in metrics[False].items():
        assert metrics[True][key] == pytest.approx(want, rel=1e-5, abs=1e-7), key


@pytest.mark.parametrize(("attention", "lean"), [("sdpa", False), ("eager", False), ("sdpa", True)])
def test_logits_equal_whole_rows_for_any_plan(tiny_model_dir, attention, lean):
    """The forward itself, on plans `plan` would not choose: groups of one split anywhere, prefixes cut short, a
    group's rows spread over sequences that each repeat its prefix; with either attention that takes a 4D mask, and
    by the lean forward."""
    trainer = trainer_for(tiny_model_dir, True, 64)
    model = trainer.model
    model.set_attn_implementation(attention)
    lean = LeanForward.for_model(model) if lean else None
    batch = make_batch(3, 3, groups=3, seed=4)
    ids, attention, lengths = _rows(batch, np.arange(num_episodes(batch)), "tokens", torch.long)
    lengths = np.asarray(lengths)
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=attention, use_cache=False).logits
    rows = len(lengths)
    plans = {
        "every row its own prefix, split before its last token": (np.arange(rows), lengths - 1),
        "every row its own prefix of one token": (np.arange(rows), np.ones(rows, np.int64)),
        "groups, prefixes cut to 2": (batch["group"], np.full(rows, 2)),
        "groups, a row per sequence": (batch["group"], np.full(rows, 2), np.arange(rows)),
        "groups, rows split at 1 or 3, two sequences each": (
            batch["group"],
            np.where(np.arange(rows) % 2, 1, 3),
            2 * np.unique(batch["group"], return_inverse=True)[1] + np.arange(rows) % 2,
        ),
    }
    for name, (owner, split, *sequence) in plans.items():
        _, owner = np.unique(owner, return_inverse=True)
        leader = np.array([np.flatnonzero(owner == k)[0] for k in range(owner.max() + 1)])
        kinds = [shared_prefix.PrefixPlan(owner, split, leader, 0, 0, *sequence)]
        if not sequence:  # on the prefixes' KV cache: a prefix's rows split alike there
            kinds.append(shared_prefix.PrefixPlan(owner, split, leader, 0, 0, cached=True))
        if not sequence:  # as trees of the same rows: one per owner, and cut into runs packed together
            for tree in (
                shared_prefix.prefix_tree.grow(ids.numpy(), lengths, owner),
                shared_prefix.prefix_tree.grow(ids.numpy(), lengths, np.zeros_like(owner)),  # one tree, many roots
                shared_prefix.prefix_tree.fit(ids.numpy(), lengths, owner, pair_cost=1.0)[0],
            ):
                kinds.append(shared_prefix.PrefixPlan(owner, split, leader, 0, 0, tree=tree))
        for plan in kinds:
            with torch.no_grad():
                got = shared_prefix.logits(model, ids, lengths, plan, lean)
            for row, length in enumerate(lengths):
                message = f"{name}, cached={plan.cached}, tree={plan.tree is not None}"
                torch.testing.assert_close(got[row, :length], want[row, :length], rtol=1e-5, atol=1e-5, msg=message)


def test_plan_shares_the_longest_common_prefix_and_keeps_a_token_after_it():
    ids = np.array(
        [
            [1, 2, 3, 4, 5, 0],
            [1, 2, 3, 9, 0, 0],
            [1, 2, 3, 4, 6, 7],
            [7, 7, 7, 7, 7, 7],  # alone in group 1, with a long row
            [1, 2, 0, 0, 0, 0],
            [1, 2, 0, 0, 0, 0],  # group 2: identical rows of 2
        ]
    )
    lengths = np.array([5, 4, 6, 6, 2, 2])
    plan = shared_prefix.plan(ids, lengths, np.array([0, 0, 0, 1, 2, 2]), layouts=("packed", "cached"))
    # group 0 shares [1 2 3]; group 2 its first token (a row keeps one after the prefix); the lone row all but its last
    assert plan.split.tolist() == [3, 3, 3, 5, 1, 1]
    assert plan.owner.tolist() == [0, 0, 0, 1, 2, 2]
    # one sequence per group, the longest group 0's: its prefix, then rests of 2, 1 and 3 (two sequences: 4 x 7)
    assert plan.sequence.tolist() == [0, 0, 0, 1, 2, 2]
    assert plan.positions == 3 * (3 + 2 + 1 + 3) < plan.whole_positions == 6 * 6
    assert shared_prefix.plan(ids[:1], lengths[:1], np.array([0])) is None  # one row: nothing to share
    assert shared_prefix.plan(ids[[3]], lengths[[3]], np.array([5])) is None


def test_a_tree_shares_every_prefix_two_rows_of_a_group_share():
    ids = np.array(
        [
            [1, 2, 3, 4, 5, 0],
            [1, 2, 3, 9, 0, 0],
            [1, 2, 3, 4, 6, 7],
            [7, 7, 7, 7, 7, 7],  # alone in group 1
            [1, 2, 0, 0, 0, 0],
            [1, 2, 0, 0, 0, 0],  # group 2: identical rows of 2
        ]
    )
    lengths = np.array([5, 4, 6, 6, 2, 2])
    plan = shared_prefix.plan(ids, lengths, np.array([0, 0, 0, 1, 2, 2]))
    # group 0: [1 2 3 4] shared by rows 0 and 2, [1 2 3] by all three: 8 nodes (the packed layout's one
    # sequence holds 3 + 2 + 1 + 3 = 9); group 1: its row's 6; group 2's two rows are group 0's first two nodes.
    # One tree of all the rows (14 nodes, one sequence) beats a tree per group (two sequences of 8)
    assert plan.tree is not None and plan.tree.nodes.tolist() == [14]
    assert plan.positions == 14 < 3 * 9  # the packed layout: 3 sequences of 9
    per_group, _ = shared_prefix.prefix_tree.fit(ids, lengths, np.array([0, 0, 0, 1, 2, 2]), pair_cost=0.0)
    assert per_group.nodes.tolist() == [8, 8]  # group 0's tree; group 1's and group 2's in one sequence
    assert plan.tree.node[4].tolist() == plan.tree.node[0, :2].tolist() + [plan.tree.node[0, 1]] * 4
    node = plan.tree.node
    assert node[0, :4].tolist() == node[2, :4].tolist() and node[0, 4] != node[2, 4]
    assert node[1, :3].tolist() == node[0, :3].tolist() and node[1, 3] not in node[0].tolist() + node[2].tolist()
    assert node[4].tolist() == node[5].tolist()
    # a row of one token keeps nothing after a shared prefix, so only the tree shares with it
    short = shared_prefix.plan(np.array([[5, 1, 2, 3], [5, 0, 0, 0], [5, 1, 2, 4]]), np.array([4, 1, 4]), np.zeros(3))
    assert short.tree is not None and short.positions == 5
    assert shared_prefix.plan(ids[:1], lengths[:1], np.array([0]), layouts=("packed", "cached")) is None
    packing = shared_prefix.prepare(ids, lengths, plan)
    for row, length in enumerate(lengths):  # each row's tokens and positions, read back through its nodes
        flat = packing.index[row, :length]
        assert packing.ids.reshape(-1)[flat].tolist() == ids[row, :length].tolist()
        assert packing.position_ids.reshape(-1)[flat].tolist() == list(range(length))
        sequence = flat // packing.ids.shape[1]
        within = flat % packing.ids.shape[1]
        for t in range(length):  # a node attends to exactly its row's nodes up to it
            sees = np.flatnonzero(packing.allowed[sequence[t], within[t]])
            assert sorted(sees.tolist()) == sorted(set(within[: t + 1].tolist())), (row, t)


def test_a_tree_cut_into_runs_repeats_what_they_share_and_packs_them_first_fit():
    """Priced attention narrows the trees: a group's walk is cut into runs of at most W nodes, each run's tree
    repeating the tokens it shares with earlier runs, and runs of any group share a sequence where they fit."""
    rows = [
        [5, 10, 11, 12, 13, 14],
        [5, 20, 21, 22, 23, 24],
        [5, 30, 31],
        [5, 40],  # group 0: one tree of 6 + 5 + 2 + 1 = 14 nodes
        [7, 8],  # group 1
    ]
    lengths = np.array([len(row) for row in rows])
    ids = np.array([row + [0] * (6 - len(row)) for row in rows])
    owner = np.array([0, 0, 0, 0, 1])
    whole = shared_prefix.prefix_tree.grow(ids, lengths, owner)
    assert whole.nodes.tolist() == [14, 2]
    narrow, cost = shared_prefix.prefix_tree.fit(ids, lengths, owner, pair_cost=1.0)
    # W = 6, the longest row: runs [row 0], [row 1], [rows 2, 3] (4 nodes: the shared 5 once), [row 4]; the last
    # two fit one sequence. 3 x (6 + 36) beats W = 9 (2 x (9 + 81)) and one tree per group (2 x (14 + 196))
    assert narrow.nodes.tolist() == [6, 6, 6] and cost == 3 * (6 + 36)
    assert narrow.owner.tolist() == [0, 1, 2, 2, 2]
    assert narrow.node[2, 0] == narrow.node[3, 0] != narrow.node[4, 0]
    for tree in (whole, narrow):
        packing = shared_prefix.Packing(*shared_prefix.prefix_tree.pack(ids, lengths, tree))
        width = packing.ids.shape[1]
        for row, length in enumerate(lengths):
            flat = packing.index[row, :length]
            assert packing.ids.reshape(-1)[flat].tolist() == rows[row]
            assert packing.position_ids.reshape(-1)[flat].tolist() == list(range(length))
            for t in range(length):  # a node sees exactly its row's nodes up to it, in its own sequence
                sees = np.flatnonzero(packing.allowed[flat[t] // width, flat[t] % width])
                assert sorted(sees.tolist()) == sorted(set((flat[: t + 1] % width).tolist())), (row, t)


def random_groups(rng, groups: int, rows_each: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Right-padded rows: a group's rows share a prompt of 3-12 tokens (every prompt starts alike, as a chat template's
    do), then 1-8 tokens of a few values (rows often share their first moves too)."""
    rows, group_of = [], []
    for group in range(groups):
        prompt = [1, 2, *rng.integers(3, 9, size=int(rng.integers(1, 11))).tolist()]
        for _ in range(rows_each):
            rows.append(prompt + rng.integers(9, 12, size=int(rng.integers(1, 9))).tolist())
            group_of.append(group * 3 + 1)  # group ids as a batch holds them: not 0..groups-1
    lengths = np.array([len(row) for row in rows])
    ids = np.array([row + [0] * (lengths.max() - len(row)) for row in rows])
    return ids, lengths, np.array(group_of)


def test_a_bounded_fit_leaves_out_only_trees_that_cost_more_than_the_bound():
    rng = np.random.default_rng(3)
    for trial in range(40):
        ids, lengths, groups = random_groups(rng, int(rng.integers(1, 5)), int(rng.integers(1, 9)))
        owner = np.unique(groups, return_inverse=True)[1].reshape(-1)
        for tree_owner in (owner, np.zeros_like(owner)):
            for pair_cost in (0.0, 0.005, 0.05):
                tree, cost = shared_prefix.prefix_tree.fit(ids, lengths, tree_owner, pair_cost)
                for bound in (cost / 2, cost * 0.99, cost, cost * 1.01, np.inf):
                    bounded, bounded_cost = shared_prefix.prefix_tree.fit(ids, lengths, tree_owner, pair_cost, bound)
                    if bounded is None:
                        assert bound < cost and bounded_cost == np.inf, (trial, bound, cost)
                    else:
                        assert bounded_cost == cost and np.array_equal(bounded.node, tree.node)
                        assert np.array_equal(bounded.owner, tree.owner)
                        assert np.array_equal(bounded.nodes, tree.nodes)
                assert shared_prefix.prefix_tree.fit(ids, lengths, tree_owner, pair_cost, cost)[0] is not None


def exhaustive_plan(ids, lengths, groups, pair_cost, layouts):
    """What `plan` picks when every layout is laid out and priced, none left out by a bound: the cheapest, of equal
    costs whole rows, then packed, then a tree per group, then one tree, then the KV cache layout."""
    owner = np.unique(groups, return_inverse=True)[1].reshape(-1)
    prefixes = int(owner.max()) + 1
    longest = int(lengths.max())
    candidates = [(len(lengths) * (longest + longest * longest * pair_cost), "none")]
    for layout in ("packed", "cached"):
        if layout in layouts:
            alone = shared_prefix.plan(ids, lengths, groups, pair_cost, (layout,))  # bounded by whole rows alone
            if alone is not None:
                candidates.append((layout_cost(alone, lengths, pair_cost), layout))
    if "tree" in layouts:
        for index, tree_owner in enumerate((owner, np.zeros_like(owner)) if prefixes > 1 else (owner,)):
            candidates.append((shared_prefix.prefix_tree.fit(ids, lengths, tree_owner, pair_cost)[1], f"tree{index}"))
    order = ["none", "packed", "tree0", "tree1", "cached"]
    return min(candidates, key=lambda c: (c[0], order.index(c[1])))


def layout_cost(plan, lengths, pair_cost) -> float:
    """A packed or cached plan's cost, as `plan` prices it."""
    rest = lengths - plan.split
    if plan.cached:
        prefixes, cut, tail = len(plan.leader), int(plan.split.max()), int(rest.max())
        pairs = prefixes * cut**2 + len(lengths) * tail * (cut + tail)
        return plan.positions + pairs * pair_cost + shared_prefix.SECOND_FORWARD_COST
    sequences = int(plan.sequence.max()) + 1
    width = plan.positions // sequences
    return sequences * (width + width * width * pair_cost)


def test_plan_picks_what_pricing_every_layout_picks():
    """`plan` lays out the tree of all the rows first and leaves out the layouts whose least cost is over it; what it
    picks is what laying out and pricing every layout picks, ties included."""
    rng = np.random.default_rng(5)
    for trial in range(60):
        ids, lengths, groups = random_groups(rng, int(rng.integers(1, 5)), int(rng.integers(1, 9)))
        for pair_cost in (0.0, 0.005, 0.05):
            for layouts in (("packed", "tree", "cached"), ("packed", "cached"), ("tree",)):
                picked = shared_prefix.plan(ids, lengths, groups, pair_cost, layouts)
                _, expected = exhaustive_plan(ids, lengths, groups, pair_cost, layouts)
                kind = "none" if picked is None else "cached" if picked.cached else "packed"
                if picked is not None and picked.tree is not None:
                    owner = np.unique(groups, return_inverse=True)[1].reshape(-1)
                    kind = next(
                        f"tree{index}"
                        for index, tree_owner in enumerate((owner, np.zeros_like(owner)))
                        if np.array_equal(
                            shared_prefix.prefix_tree.fit(ids, lengths, tree_owner, pair_cost)[0].node,
                            picked.tree.node,
                        )
                    )
                assert kind == expected, (trial, pair_cost, layouts, kind, expected)


def test_plan_prices_attention_and_picks_the_cheaper_layout():
    """Eight 64-token rows sharing a 40-token prompt: one packed sequence (the prompt, then eight 24-token rests) is the
    fewest positions, but its attention costs 232^2 pairs; with pairs priced, `plan` packs two sequences of four rows.
    With a 4-token prompt neither layout saves enough: whole rows. Eight 145-token rows after a 38-token prompt (the
    quickstart game's shape): packing would square the long rests' attention; the KV cache layout is cheapest."""
    rng = np.random.default_rng(0)
    groups = np.zeros(8, np.int64)
    for prompt, length, priced_rows in ((40, 64, [4, 4]), (4, 64, None), (38, 145, "cached")):
        lengths = np.full(8, length)
        ids = np.concatenate([np.full((8, prompt), 7), rng.integers(10, 90, size=(8, length - prompt))], axis=1)
        alone = shared_prefix.plan(ids, lengths, groups)  # pairs free: one packed sequence, the fewest positions
        assert alone.sequence.tolist() == [0] * 8 and alone.positions == prompt + 8 * (length - prompt)
        priced = shared_prefix.plan(ids, lengths, groups, pair_cost=1 / 100)
        if priced_rows is None:
            assert priced is None
        elif priced_rows == "cached":
            assert priced.cached and priced.split.tolist() == [prompt] * 8
            assert priced.positions == prompt + 8 * (length - prompt)
            only_packed = shared_prefix.plan(ids, lengths, groups, pair_cost=1 / 100, layouts=("packed",))
            assert only_packed is None  # packing costs more than whole rows here
        else:
            assert not priced.cached and np.bincount(priced.sequence).tolist() == priced_rows
            assert priced.positions == len(priced_rows) * (prompt + max(priced_rows) * (length - prompt))


def test_check_model_names_the_layouts_a_model_can_take(tiny_model_dir):
    """sdpa and eager apply a custom 4D mask (both layouts); flash attention ignores one (the KV cache layout only);
    sliding-window layers fit neither, refused with the fix named."""
    model = trainer_for(tiny_model_dir, True, 64).model
    assert shared_prefix.check_model(model) == ("packed", "tree", "cached")
    model.config._attn_implementation = "flash_attention_2"  # set_attn_implementation needs the package
    assert shared_prefix.check_model(model) == ("cached",)
    model.config._attn_implementation = "sdpa"
    model.config.layer_types = ["sliding_attention", "full_attention"]
    with pytest.raises(
        ValueError, match=r"\['sliding_attention'\] layers, whose window neither layout keeps.*shared_prefix=false"
    ):
        shared_prefix.check_model(model)


def test_config_refuses_what_keeps_no_cache():
    base = {"model": {"path": "m"}, "trainer": {"shared_prefix": True}}
    for parallelism, layout in (({"fsdp": True}, {"trainer": 2}), ({"activation_checkpointing": True}, {})):
        with pytest.raises(ValueError, match=r"trainer.shared_prefix=true .* set parallelism\.\w+=false or trainer"):
            from_dict({**base, "parallelism": parallelism, "layout": layout})


@pytest.mark.timeout(900)  # two real runs; seconds each on an idle machine, minutes on a loaded one
def test_agentrl_train_gives_the_same_run_with_and_without(tmp_path, tiny_model_dir):
    """`agentrl train` (one process, the quickstart game, 2 groups of 8), 3 steps each way: every rollout scalar the
    same, every training scalar within float rounding (the weights differ by it after the first step)."""
    runs = {}
    for shared in ("true", "false"):
        overrides = small_run(
            tmp_path / shared,
            tiny_model_dir,
            **{"rollout.tasks_per_step": 2, "rollout.group_size": 8, "trainer.micro_batch_size": 16, "eval.every": 0},
            **{"trainer.shared_prefix": shared},
        )
        command = [sys.executable, "-m", "agentrl.cli", "train", QUICKSTART, *overrides]
        environment = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        assert_ok(subprocess.run(command, env=environment, capture_output=True, text=True, timeout=600, cwd=ROOT))
        runs[shared] = scalars(tmp_path / shared / "run")
    positions = [value for _, value in runs["true"].pop("train/shared_prefix_positions")]
    assert len(positions) == 3 and max(positions) < 0.9
    assert set(runs["true"]) == set(runs["false"])
    compared = [tag for tag in runs["false"] if not tag.startswith(("time/", "perf/"))]
    assert any(tag.startswith("rollout/") for tag in compared) and "train/loss" in compared
    for tag in compared:
        got, want = runs["true"][tag], runs["false"][tag]
        assert [step for step, _ in got] == [step for step, _ in want], tag
        if tag.startswith("train/"):
            assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-4, abs=1e-6), tag
        else:
            assert got == want, tag
