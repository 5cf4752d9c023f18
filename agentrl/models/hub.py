"""What a model path names when it is not a folder here: a Hugging Face hub id."""

from __future__ import annotations

import re

HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")  # "name" or "namespace/name"
