"""Pivots as a Hugging Face dataset: parquet shards plus a README dataset card.

`datasets.load_dataset("parquet", data_files=...)` (or `load_dataset(DIR)`, which reads the
card's `configs`) reads it back, and `pivots_from_rows` turns its rows into the same pivots.
The nested fields (`messages`, `tools`, `expert`, `context`, `source`, `profile`) are JSON text
columns: parquet gives a list of unlike objects one struct type and fills the keys an item lacks
with nulls, so only text keeps every pivot exactly. Flat columns beside them (`trajectory`, `turn`,
`expert_kind`, `profile_mean`, ...) are for filtering and browsing without decoding.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pivot_envs.errors import PivotEnvsError
from pivot_envs.pivot import Pivot, PivotFormatError

JSON_COLUMNS = ("messages", "tools", "expert", "context", "source", "profile")
DATA_FILE = "data/train-00000-of-00001.parquet"
ROWS_PER_GROUP = 1000  # rows held before a parquet row group is written: bounded memory


class HFDatasetError(PivotEnvsError, OSError):
    """A dataset folder that cannot be written (not empty, no permission); the message names it."""


def _schema():
    import pyarrow as pa

    return pa.schema(
        [
            ("id", pa.string()),
            ("domain", pa.string()),
            ("trajectory", pa.string()),
            ("turn", pa.int64()),
            ("expert_kind", pa.string()),
            ("profile_k", pa.int64()),
            ("profile_mean", pa.float64()),
            ("profile_var", pa.float64()),
            *[(name, pa.string()) for name in JSON_COLUMNS],
        ]
    )


def _expert_kind(expert: dict) -> str:
    calls = expert.get("tool_calls") or []
    return "parallel_calls" if len(calls) > 1 else "tool_call" if calls else "message"


def pivot_to_row(pivot: Pivot) -> dict[str, Any]:
    """One dataset row of a pivot (the nested fields as JSON text; `profile` null when unprofiled)."""
    record = pivot.to_dict()
    turn = pivot.source.get("turn")
    row: dict[str, Any] = {
        "id": pivot.id,
        "domain": pivot.domain,
        "trajectory": pivot.trajectory_id,
        "turn": turn if isinstance(turn, int) and not isinstance(turn, bool) else None,
        "expert_kind": _expert_kind(pivot.expert),
        "profile_k": pivot.profile.k if pivot.profile else None,
        "profile_mean": pivot.profile.mean if pivot.profile else None,
        "profile_var": pivot.profile.var if pivot.profile else None,
    }
    for name in JSON_COLUMNS:
        value = record.get(name)
        row[name] = None if value is None else json.dumps(value, ensure_ascii=False)
    return row


def pivots_from_rows(rows: Iterable[dict[str, Any]]) -> Iterator[Pivot]:
    """The pivots of dataset rows (as `datasets` or pyarrow give them); raises PivotFormatError
    naming the row whose JSON columns do not decode."""
    for number, row in enumerate(rows):
        try:
            record = {"id": row["id"], "domain": row["domain"]}
            for name in JSON_COLUMNS:
                if row.get(name) is not None:
                    record[name] = json.loads(row[name])
        except (KeyError, TypeError, json.JSONDecodeError) as error:
            raise PivotFormatError(f"dataset row {number}: {type(error).__name__}: {error}") from None
        yield Pivot.from_dict(record)


def write_hf_dataset(
    pivots: Iterable[Pivot], out_dir: str | os.PathLike[str], *, title: str = "Pivots", source: str = ""
) -> int:
    """Write pivots to `out_dir` as a Hugging Face dataset (`data/*.parquet` + `README.md`), streaming;
    returns the count. `source` names where the pivots came from (and whose license applies) on the card.
    Raises HFDatasetError when `out_dir` holds files already or cannot be written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise HFDatasetError(f"{out}: the dataset folder is not empty; choose a new one")
    try:
        (out / "data").mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise HFDatasetError(f"{out}: cannot write it: {error.strerror or error}") from error
    schema = _schema()
    count, domains, kinds, profiled = 0, {}, {}, 0
    buffer: list[dict[str, Any]] = []
    try:
        with pq.ParquetWriter(out / DATA_FILE, schema, compression="zstd") as writer:
            for pivot in pivots:
                row = pivot_to_row(pivot)
                buffer.append(row)
                count += 1
                domains[row["domain"]] = domains.get(row["domain"], 0) + 1
                kinds[row["expert_kind"]] = kinds.get(row["expert_kind"], 0) + 1
                profiled += row["profile_k"] is not None
                if len(buffer) >= ROWS_PER_GROUP:
                    writer.write_table(pa.Table.from_pylist(buffer, schema=schema))
                    buffer.clear()
            if buffer:
                writer.write_table(pa.Table.from_pylist(buffer, schema=schema))
        (out / "README.md").write_text(
            _card(title, source, count, domains, kinds, profiled), encoding="utf-8"
        )
    except OSError as error:
        raise HFDatasetError(f"{out}: cannot write it: {error.strerror or error}") from error
    return count


def _card(title: str, source: str, count: int, domains: dict, kinds: dict, profiled: int) -> str:
    """The README dataset card: YAML front matter (configs, features) and what the columns hold."""
    features = "\n".join(
        f"  - name: {name}\n    dtype: {dtype}"
        for name, dtype in (
            ("id", "string"),
            ("domain", "string"),
            ("trajectory", "string"),
            ("turn", "int64"),
            ("expert_kind", "string"),
            ("profile_k", "int64"),
            ("profile_mean", "float64"),
            ("profile_var", "float64"),
            *[(name, "string") for name in JSON_COLUMNS],
        )
    )
    size = (
        "n<1K"
        if count < 1000
        else "1K<n<10K"
        if count < 10_000
        else "10K<n<100K"
        if count < 100_000
        else "100K<n<1M"
    )
    listed = ", ".join(f"{name or '(none)'} {n}" for name, n in sorted(domains.items()))
    action_kinds = ", ".join(f"{name} {n}" for name, n in sorted(kinds.items()))
    origin = f"Made from {source}; its license and terms apply to these rows.\n\n" if source else ""
    return f"""---
configs:
- config_name: default
  data_files:
  - split: train
    path: data/train-*
dataset_info:
  features:
{features}
  splits:
  - name: train
    num_examples: {count}
size_categories:
- {size}
tags:
- pivot-envs
- pivotrl
- agents
- reinforcement-learning
---

# {title}

{count} pivots (PivotRL): each row is one assistant turn of an expert trajectory, with the
conversation before it. Domains: {listed}. Expert actions: {action_kinds}. With a reference
policy's profile (reward mean and variance over K samples): {profiled}.

{origin}## Columns

| column | holds |
|---|---|
| `id` | the pivot id: source trajectory + assistant-turn index |
| `domain` | the pivot-envs domain (`tool-use`, `terminal`, `swe`, `search`, ...) |
| `trajectory`, `turn` | the source trajectory (split by it, never by row) and the turn's index |
| `expert_kind` | `tool_call`, `parallel_calls` or `message` |
| `profile_k`, `profile_mean`, `profile_var` | the profile's K, mean and variance (null: unprofiled) |
| `messages`, `tools`, `expert`, `context`, `source`, `profile` | the pivot record's fields as JSON text (OpenAI chat messages, function tool schemas, the expert assistant message, domain data, provenance, profile) |

## Use

```python
import datasets
from pivot_envs.hf_dataset import pivots_from_rows

rows = datasets.load_dataset("parquet", data_files="data/*.parquet", split="train")
pivots = list(pivots_from_rows(rows))  # the pivot records, exactly as written
adv = rows.filter(lambda r: r["profile_var"] and r["profile_var"] > 0 and r["profile_mean"] < 0.6)  # D_adv
```

`gym.make("pivot/<domain>-v0", pivots=...)` takes the pivots; `pivotrl` commands take them as
JSONL (`pivot_envs.pivot.write_pivots`).
"""
