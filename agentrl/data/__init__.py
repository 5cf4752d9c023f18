"""Tasks from data: loading datasets, task sources, and what the trainer leader records per step."""
