"""What the page's events send and take: the inputs of a run by name, the outputs of each event in order, and the
small values they are made of (an output tuple, the summary table, the inspector's choice, a column's reference).

Each handler yields tuples in the order of its *_OUTPUTS list; gr.skip() leaves a component as it is.
"""

from __future__ import annotations

from typing import Any, Sequence

import gradio as gr
import pandas as pd

from medusa_lib.present import LABELS, NOT_TIMED, PATH_COLUMNS, SUMMARY_COLUMNS, RunRecord, summary_rows

# The page's inputs of a run, by name, in the order ui.py wires their components and the undocumented /run takes
# them: the prompt, the settings (``Request``'s names; the Mode choice stands for ``sample``), the inspector's choice.
PAGE_INPUTS = (
    "prompt",
    "max_new_tokens",
    "temperature",
    "epsilon",
    "delta",
    "tree",
    "custom_tree",
    "chat_template",
    "lookup_branch",
    "seed",
    "numerics",
    "insp_label",
    "mode",
    "drafter",
    "run_live",
)
RUN_OUTPUTS = [
    "status",
    "col_plain",
    "col_greedy",
    "col_typical",
    "timeline",
    "badge",
    "summary",
    "sampling",
    "session",
    "insp_step",
    "tree_plot",
    "mask_plot",
    "path_table",
]
REPLAY_OUTPUTS = ["status", "col_plain", "col_greedy", "col_typical", "timeline"]
INSPECT_OUTPUTS = ["tree_plot", "mask_plot", "path_table"]
# the inspector's choice -> the views it shows
INSPECTED = {
    "Medusa greedy / exact sampling": ("medusa-greedy", "medusa-sample"),
    LABELS["medusa-typical"]: ("medusa-typical",),
}
INSPECT_CHOICES = list(INSPECTED)


def by_name(names: Sequence[str], values: Sequence, named: dict[str, Any]) -> dict[str, Any]:
    """Values sent in ``names``' order, then others by name, as one dict by name."""
    if len(values) > len(names):
        raise TypeError(f"{len(values)} values sent; at most {len(names)} are taken, in the order {', '.join(names)}.")
    return {**dict(zip(names, values)), **named}


def pack(names: list[str], **values: Any) -> tuple:
    return tuple(values[n] if n in values else gr.skip() for n in names)


def empty_summary() -> pd.DataFrame:
    return pd.DataFrame(columns=SUMMARY_COLUMNS)


def summary_frame(records: dict[str, RunRecord]) -> pd.DataFrame:
    """The summary table; a rate that could not be measured (None: no decode step, or no plain run) shows as
    NOT_TIMED."""
    rows = [{k: NOT_TIMED if v is None else v for k, v in row.items()} for row in summary_rows(records)]
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def empty_paths() -> pd.DataFrame:
    return pd.DataFrame(columns=PATH_COLUMNS)


def method_of(label: str, records: dict | None = None) -> str:
    """The run the inspector's choice shows: the middle column's (greedy, or exact sampling) or typical's."""
    views = INSPECTED.get(label, INSPECTED[INSPECT_CHOICES[0]])
    return next((v for v in views if v in (records or {})), views[0])


def best_step(record: RunRecord) -> int:
    """The step to open the inspector on: the first with the longest accepted path."""
    if len(record.views) < 2:
        return 1
    return max(range(1, len(record.views)), key=lambda i: (record.views[i].step.accept_length, -i))


def reference_of(records: dict[str, RunRecord], method: str) -> RunRecord | None:
    """The run a column's speed-up is measured against: the first column's (plain), for every other column."""
    first = next(iter(records), None)
    return records[first] if first is not None and method != first else None
