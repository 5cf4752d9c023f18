"""Task sources: seeded tasks as before, dataset rows sharded over ranks, shuffled per epoch, resumable."""

from collections import Counter

import datasets
import pytest

from agentrl.data import tasks as tasks_module
from agentrl.data.tasks import DatasetTasks, SeededTasks, resume_positions, task_seed

ROWS = 23  # not a multiple of the ranks: shards differ by one row


def rows(count=ROWS, ids=True):
    data = {"prompt": [f"q{i}" for i in range(count)], "answer": [str(i) for i in range(count)]}
    if ids:
        data["id"] = [f"row-{i}" for i in range(count)]
    return datasets.Dataset.from_dict(data)


def test_seeded_tasks_are_the_seed_per_step_and_index():
    tasks = SeededTasks(7).take(3, [0, 5])
    assert [t.seed for t in tasks] == [task_seed(7, 3, 0), task_seed(7, 3, 5)]
    assert [t.id for t in tasks] == [str(t.seed) for t in tasks] and all(t.options is None for t in tasks)


@pytest.mark.parametrize("shards", [1, 2, 3])
def test_every_row_once_per_epoch_over_all_ranks_and_a_new_order_each_epoch(shards):
    dataset = rows()
    sources = [DatasetTasks(dataset, "rows", 0, shard, shards) for shard in range(shards)]
    orders = []
    for _epoch in range(3):
        seen = []
        for source in sources:  # each rank walks exactly its share of the epoch
            seen += [t.id for t in source.take(0, list(range(source.shard_size)))]
        assert Counter(seen) == Counter(f"row-{i}" for i in range(ROWS))
        orders.append(seen)
    assert orders[0] != orders[1] != orders[2]
    assert all(source.stats()["data/epoch"] == 3.0 for source in sources)


def test_rows_reach_the_env_whole_with_their_id_or_index():
    task = DatasetTasks(rows(), "rows", 0, 0, 1, shuffle=False).take(4, [2])[0]
    assert task == type(task)("row-0", task_seed(0, 4, 2), {"prompt": "q0", "answer": "0", "id": "row-0"})
    no_ids = DatasetTasks(rows(ids=False), "rows", 0, 0, 1, shuffle=False).take(0, [0, 1])
    assert [t.id for t in no_ids] == ["0", "1"]


def test_a_source_rebuilt_at_its_position_continues_with_the_next_row():
    dataset = rows()
    whole = DatasetTasks(dataset, "rows", 5, 1, 2)
    expected = [t.id for t in whole.take(0, list(range(30)))]
    first = DatasetTasks(dataset, "rows", 5, 1, 2)
    served = [t.id for t in first.take(0, list(range(13)))]
    again = DatasetTasks(dataset, "rows", 5, 1, 2, consumed=first.position()["consumed"])
    served += [t.id for t in again.take(0, list(range(17)))]
    assert served == expected


def test_resume_positions_keep_the_position_or_start_the_next_epoch_when_the_ranks_change():
    saved = {"rows": ROWS, "consumed": [30, 29]}
    assert resume_positions(saved, ROWS, 2) == ([30, 29], None)
    assert resume_positions(None, ROWS, 2) == ([0, 0], None)
    positions, note = resume_positions(saved, ROWS, 3)  # epoch 2 of 2 ranks (12, 11 rows) was under way
    assert positions == [3 * 8, 3 * 8, 3 * 7] and "epoch 3" in note


def test_extra_rounds_of_dynamic_sampling_consume_more_rows_and_the_position_counts_them(tiny_model_dir):
    from tests.unit.test_dynamic_sampling import worker

    dataset = rows(64)
    made = worker(tiny_model_dir, {"name": "dapo", "max_extra_rounds": 3}, index=1)
    made.task_source = DatasetTasks(dataset, "rows", 0, 1, 2)
    reference = DatasetTasks(dataset, "rows", 0, 1, 2)
    consumed = 0
    for step in range(2):
        episodes, stats = made.collect(step)
        generated = int(stats["rollout/generated_groups"])
        assert stats["rollout/extra_rounds"] >= 1 and generated > len({e.group for e in episodes})
        consumed += generated
        assert made.task_source.position() == {"consumed": consumed, "rows": 64}
        served = list(dict.fromkeys((e.group, e.task_id) for e in made.generated))
        assert [task_id for _, task_id in served] == [t.id for t in reference.take(step, range(generated))]
        assert stats["data/epoch"] == consumed / 32


def test_rows_taken_together_are_the_rows_taken_one_by_one():
    data = {
        "prompt": [[{"role": "user", "content": f"q{i}"}] for i in range(ROWS)],
        "answer": [str(i) for i in range(ROWS)],
        "score": [i / 2 for i in range(ROWS)],
    }
    dataset = datasets.Dataset.from_dict(data)
    together = DatasetTasks(dataset, "rows", 3, 0, 1).take(2, list(range(30)))  # over an epoch's end
    single = DatasetTasks(dataset, "rows", 3, 0, 1)
    one_by_one = [single.at(2, index, position) for index, position in enumerate(single.reserve(30))]
    assert together == one_by_one and together[0].options["prompt"][0]["role"] == "user"


@pytest.mark.parametrize("decoded_max_bytes", [0, tasks_module.DECODED_ROWS_MAX_BYTES])
def test_rows_served_again_are_the_rows_read_and_an_env_changing_one_changes_no_later_copy(
    monkeypatch, decoded_max_bytes
):
    """A small dataset keeps the rows it served decoded (larger ones read Arrow each time): the same rows either way,
    each a new object down to its nested lists and dicts."""
    monkeypatch.setattr(tasks_module, "DECODED_ROWS_MAX_BYTES", decoded_max_bytes)
    data = {
        "prompt": [[{"role": "user", "content": f"q{i}"}] for i in range(ROWS)],
        "meta": [{"tags": [f"t{i}"], "level": i} for i in range(ROWS)],
    }
    dataset = datasets.Dataset.from_dict(data)
    source = DatasetTasks(dataset, "rows", 3, 0, 1)
    assert (source._decoded is None) == (decoded_max_bytes == 0)
    first = source.take(0, list(range(ROWS)))  # epoch 0: every row read once
    first[0].options["prompt"][0]["content"] = "changed by an env"
    first[0].options["meta"]["tags"].append("more")
    again = source.take(1, list(range(2 * ROWS)))  # epochs 1 and 2, in other orders: every row served from memory
    reference = DatasetTasks(dataset, "rows", 3, 0, 1)
    reference.take(0, list(range(ROWS)))
    expected = [reference._read([reference.row_index(p)])[0] for p in range(ROWS, 3 * ROWS)]
    assert [task.options for task in again] == expected
    assert all(
        task.options["meta"]["tags"] == [task.options["prompt"][0]["content"].replace("q", "t")] for task in again
    )
    rows_of_row_0 = [task.options for task in again if task.id == first[0].id]
    assert len(rows_of_row_0) == 2 and rows_of_row_0[0] is not rows_of_row_0[1]
    assert rows_of_row_0[0]["meta"]["tags"] is not rows_of_row_0[1]["meta"]["tags"]
