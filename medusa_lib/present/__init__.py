"""What the playground page shows, without gradio: settings, run records, the runner and the inspector's data.

Uses core/ only; never the offline pipeline. The page's UI (``ui/``) imports from here.
"""

from types import ModuleType as _ModuleType

from .drafter import DRAFTERS, Drafters, default_drafter
from .drafter_files import untrained_heads
from .eagle_sweep import EAGLE_BUDGETS, BudgetPoint, eagle_budgets
from .inspector import PATH_COLUMNS, mask_data, path_rows, token_label, tree_layout, tree_nodes
from .limits import PROMPT_TOKENS, any_of, deadline, default_prompt_tokens
from .memory import release_memory
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
from .playground import Playground
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

# the public names, not the submodules importing them loaded (drafter, fit, playground, ...)
__all__ = [
    name for name, value in dict(globals()).items() if not name.startswith("_") and not isinstance(value, _ModuleType)
]
