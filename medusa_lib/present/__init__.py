"""What the playground page shows, without gradio: settings, run records, the runner and the inspector's data.

Uses core/ only; never the offline pipeline. The page's UI (``ui/``) imports from here.
"""

from .drafter import DRAFTERS, EAGLE_BUDGETS, BudgetPoint, Drafters, default_drafter, eagle_budgets
from .inspector import PATH_COLUMNS, mask_data, path_rows, token_label, tree_layout, tree_nodes
from .limits import PROMPT_TOKENS, any_of, deadline, default_prompt_tokens
from .numerics import default_numerics, numerics_label, numerics_note
from .page import (
    DRAFTED_BY,
    DRAFTER_NAMES,
    LABELS,
    NOT_TIMED,
    PLAIN_VIEWS,
    REFERENCE_NAMES,
    SAMPLE_COLUMNS,
    SUMMARY_COLUMNS,
    GreedyCheck,
    column_note,
    greedy_check,
    load_examples,
    sample_rows,
    summary_rows,
    threshold_curve,
    untimed_note,
    visible_steps,
    why_it_ended,
)
from .playground import Playground, release_memory, untrained_heads
from .records import Detokenizer, Event, Piece, RunRecord, StepView, origins
from .settings import (
    GREEDY_VIEWS,
    MAX_NEW_TOKENS_LIMIT,
    MAX_PROMPT_CHARS,
    MAX_RUN_SECONDS,
    MAX_TREE_CHARS,
    MAX_TREE_NODES,
    MODES,
    SAMPLED_VIEWS,
    PlaygroundError,
    RunStopped,
    Settings,
    sample_of_mode,
)

__all__ = [
    name
    for name in dir()
    if not name.startswith("_")
    and name
    not in (
        "checks",
        "drafter",
        "inputs",
        "inspector",
        "limits",
        "numerics",
        "page",
        "playground",
        "records",
        "settings",
    )
]
