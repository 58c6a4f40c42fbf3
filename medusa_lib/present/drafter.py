"""The page's Drafter choice: who proposes the tree the Medusa columns verify, the Medusa heads or an EAGLE head.

Both drafters run on one verifier (``core/decoding.py``: only ``propose`` differs), so the columns
compare drafters with the same acceptance rules and the same exactness guarantees. Medusa's heads
read only the base model's hidden state h_t; EAGLE's one decoder layer reads the embedding of the
token actually chosen at t+1 beside the base model's feature f_t and drafts autoregressively at the
feature level (``core/eagle.py``), growing a new dynamic tree each step (``core/dynamic_tree.py``).

Where the EAGLE head comes from (``find_eagle``): ``--eagle`` / ``MEDUSA_EAGLE`` names a folder, or
``auto`` looks next to the Medusa heads (``<heads>-eagle``, e.g. ``assets/heads/smollm2-135m-instruct-eagle``),
or ``none``. Which drafter a run uses when it names none (``default_drafter``): the one with the
higher *recorded* speed-up over plain decoding on this kind of device: both from one bench run where
the EAGLE head's ``calibration`` record holds Medusa's figure beside its own (``bench --record-eagle``
with medusa-greedy), else the Medusa heads' calibration of their default tree against the EAGLE
head's record, said to be separate records; without a recorded figure for the EAGLE head, the
Medusa heads. No figure is quoted from another kind of device, and nothing is guessed.

The Tree lab's EAGLE sweep (``eagle_budgets``) measures EAGLE's tokens per step and speed-up over
plain decoding for a few node budgets on this device, on the comparison's prompt.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

from ..core.decoding import Decoder
from ..core.defaults import device_kind, record_kind
from ..core.drafters import Drafter, EagleDrafter, LookupDrafter, MedusaDrafter
from ..core.dynamic_tree import DynamicTreeConfig
from ..core.eagle import CONFIG_FILE, EAGLE_FILE, EagleError, EagleHead, is_eagle_folder, load_eagle, read_eagle_config
from ..core.heads import HeadsConfig, HeadsError, MedusaHeads, hidden_size_of, load_heads
from ..core.messages import cause, kind, shown
from ..core.spec_metrics import Acceptance, draft_positions, step_acceptance
from ..core.tree import MedusaTree
from .numerics import EXACT
from .page import DRAFTER_NAMES  # how the page names each drafter
from .settings import PlaygroundError

DRAFTERS = ("medusa", "eagle", "lookup")
SHIPPED_HEADS = (
    Path(__file__).resolve().parents[2] / "assets" / "heads" / "smollm2-135m-instruct"
)  # the default model's
EAGLE_SUFFIX = "-eagle"  # the EAGLE head of heads folder X lives in X-eagle
EAGLE_BUDGETS = (3, 8, 16, 24, 40)  # the Tree lab's sweep of EAGLE's node budget


def eagle_beside(heads: str | Path | None) -> Path | None:
    """Where the EAGLE head of a Medusa heads folder lives: the folder's name + ``-eagle``, beside it."""
    if not heads:
        return None
    path = Path(heads).expanduser()
    return path.with_name(path.name + EAGLE_SUFFIX)


def check_eagle_folder(folder: str | Path, *, flag: str = "--eagle") -> None:
    """Refuse, before any model loads, a named EAGLE folder that cannot be one: one sentence."""
    path = Path(folder).expanduser()
    if not path.is_dir():
        raise EagleError(
            f"{flag} {str(folder)!r} is not a folder; "
            f"give the folder of an EAGLE head (with {EAGLE_FILE} and {CONFIG_FILE}), 'auto' or 'none'."
        )
    if not is_eagle_folder(path) or not (path / CONFIG_FILE).is_file():
        raise EagleError(
            f"{flag} {str(folder)!r} holds no EAGLE head: it needs {EAGLE_FILE} and {CONFIG_FILE} "
            "(python -m medusa_lib.pipeline.train_eagle makes them)."
        )
    try:
        read_eagle_config(path)  # a damaged config.json or weights file, before any model loads
    except EagleError as e:
        raise EagleError(f"{flag} {str(folder)!r}: {e}") from None


def find_eagle(eagle: str | Path | None, *, heads: str | Path | None) -> tuple[Path | None, bool]:
    """(the EAGLE folder to load or None, whether the operator named it). ``eagle``: a folder,
    ``"auto"``/None (the folder beside the Medusa heads, if there is one) or ``"none"``."""
    if eagle in (None, "", "auto"):
        beside = eagle_beside(heads)
        return (beside, False) if beside is not None and is_eagle_folder(beside) else (None, False)
    if str(eagle) == "none":
        return None, False
    check_eagle_folder(eagle)
    return Path(eagle).expanduser(), True


def load_eagle_for(folder: Path | None, model, *, named: bool) -> tuple[EagleHead | None, str]:
    """The EAGLE head for ``model`` and the line that says what the page's Drafter choice offers.
    A head the operator named must load (EagleError); one found beside the heads that does not fit
    this model is left out with the reason."""
    if folder is None:
        return (
            None,
            "No EAGLE head was found for this model (none beside the Medusa heads; --eagle names one), "
            "so the Medusa heads draft.",
        )
    try:
        read_eagle_config(folder)  # its own files: damaged or not
    except EagleError as e:
        if named:
            raise EagleError(f"--eagle {str(folder)!r}: {e}") from None
        return None, f"The EAGLE head beside the Medusa heads is left out, so the Medusa heads draft: {e}"
    try:
        head = load_eagle(folder, model=model)
    except EagleError as e:
        if named:
            raise
        return None, f"The EAGLE head beside the Medusa heads does not fit this model ({e}), so the Medusa heads draft."
    except (ValueError, OSError, RuntimeError) as e:  # a damaged file the checks above missed: one sentence
        if named:
            raise EagleError(
                f"Could not read the EAGLE head at {folder} ({cause(e, 200)}); check the files or train a new head."
            ) from None
        return (
            None,
            f"The EAGLE head beside the Medusa heads could not be read ({type(e).__name__}), "
            "so the Medusa heads draft.",
        )
    return head, ""


# ---------------------------------------------------------------------- the Medusa heads
def untrained_heads(model, num_heads: int = 4) -> MedusaHeads:
    """Identity ResBlocks on the shared lm_head: every head proposes the base model's next token."""
    hidden = hidden_size_of(model.config)
    vocab = model.get_output_embeddings().weight.shape[0]
    p = model.get_output_embeddings().weight
    return (
        MedusaHeads(HeadsConfig(hidden_size=int(hidden), vocab_size=int(vocab), num_heads=num_heads))
        .to(device=p.device, dtype=p.dtype)
        .eval()
    )


def load_medusa(
    path: Path | None, model, *, default_heads: str | Path | None = None, shown: str = ""
) -> tuple[MedusaHeads, str]:
    """(the Medusa heads for ``model``, the line that says which). A missing *default* heads folder
    falls back to untrained heads (with a note); heads the user named must load (HeadsError)."""
    shown = shown or (str(path) if path else "")
    if path is not None and (path.exists() or path != Path(default_heads or "")):
        try:
            h = load_heads(path, model=model)
        except HeadsError:
            raise
        except (
            ValueError,
            OSError,
            RuntimeError,
        ) as e:  # a damaged config.json or safetensors file: one sentence, no traceback
            raise HeadsError(
                f"Could not read the Medusa heads at {shown} ({cause(e, 200)}); check the files or train new heads."
            ) from None
        note = f"trained heads from {shown}" + (
            " (path-conditioned: each head also reads the tree's root and the tokens of its own branch)"
            if h.path_conditioned
            else " (root-conditioned: they also read the tree's root token)"
            if h.root_conditioned
            else ""
        )
        return h, note
    return untrained_heads(
        model
    ), "untrained heads (identity ResBlocks on the shared lm_head; trained heads not found" + (
        f" at {shown}" if path else ""
    ) + ")"


# ---------------------------------------------------------------------- the default rule
def medusa_speedup(defaults, device) -> float | None:
    """The Medusa heads' recorded speed-up of their default tree on this kind of device (None: no figure for
    this kind)."""
    record = getattr(defaults, "calibration", None) or {}
    if not record or defaults.note or record_kind(record) != device_kind(device):
        return None
    tree = (record.get("trees") or {}).get(defaults.tree) or {}
    return float(tree["speedup"]) if tree.get("speedup") else None


def eagle_record(head: EagleHead | None, device) -> dict | None:
    """The EAGLE head's ``calibration`` record (bench --record-eagle) if it was made on this kind of device."""
    record = getattr(head, "calibration", None) if head is not None else None
    if not isinstance(record, dict) or not record.get("speedup") or record_kind(record) != device_kind(device):
        return None
    return record


def eagle_speedup(head: EagleHead | None, device) -> float | None:
    """The EAGLE head's recorded speed-up (config.json ``calibration.speedup``) on this kind of device, or None."""
    record = eagle_record(head, device)
    return float(record["speedup"]) if record else None


def default_drafter(medusa: float | None, eagle: float | None) -> str:
    """The drafter a run uses when it names none: EAGLE only where its recorded speed-up on this kind
    of device beats the Medusa heads' (a missing Medusa figure counts as none); else Medusa."""
    return "eagle" if eagle is not None and eagle > (medusa or 0.0) else "medusa"


def default_reason(chosen: str, medusa: float | None, eagle: float | None, *, device: str, source: str = "") -> str:
    """Why the default is what it is, in one sentence (shown under the choice). ``source``: where the
    two figures come from (one bench run, or two separate records)."""
    figures = lambda: (
        f"{source or 'recorded speed-ups'} on {device}: Medusa heads {medusa:.2f}x, EAGLE head {eagle:.2f}x plain"
    )  # noqa: E731
    if chosen == "eagle":
        why = figures() if medusa else f"its recorded speed-up on {device}: {eagle:.2f}x plain"
        return f"The EAGLE head starts selected: it is the faster drafter here ({why})."
    if eagle is None:
        return (
            f"The Medusa heads start selected: the EAGLE head's config.json records no measured speed-up on {device} "
            "(the Tree lab's EAGLE section measures it on your prompt)."
        )
    return f"The Medusa heads start selected: they are the faster drafter here ({figures()})."


# ---------------------------------------------------------------------- a run's drafter
@dataclass(frozen=True)
class Drafters:
    """The drafters a Playground offers: the EAGLE head per numerics (dtype name), the default and why."""

    eagles: dict  # numerics -> EagleHead ({} : Medusa only)
    default: str = "medusa"
    note: str = ""  # the line under the page's choice: the default's reason, or why only Medusa is offered

    @property
    def available(self) -> tuple[str, ...]:
        """The drafters offered: prompt lookup needs no weights, so it is always there."""
        return DRAFTERS if self.eagles else tuple(d for d in DRAFTERS if d != "eagle")

    @property
    def tree(self) -> DynamicTreeConfig | None:
        """The EAGLE head's own dynamic tree (top-k, depth, nodes) in the page's first numerics, or None."""
        return self.tree_of()

    def tree_of(self, numerics: str | None = None) -> DynamicTreeConfig | None:
        """The dynamic tree of the EAGLE head loaded for ``numerics`` (None: float32, the page's first
        numerics, where loaded, else the one loaded): each numerics may have its own, timed on machines
        like this one (``defaults.swept_tree``)."""
        head = self.eagles.get(numerics or EXACT) or next(iter(self.eagles.values()), None)
        return head.config.tree if head is not None else None

    def resolve(self, drafter) -> str:
        """A run's drafter: ``drafter`` checked, None or "" meaning the default. One sentence on bad input."""
        if drafter is None or drafter == "":
            return self.default
        names = '"medusa", "eagle" or "lookup"'
        if not isinstance(drafter, str):
            raise PlaygroundError(f"The drafter must be {names}, not {kind(drafter)} (got {shown(drafter)}).")
        if drafter not in DRAFTERS:
            raise PlaygroundError(f"The drafter must be {names} (got {shown(drafter)}).")
        if drafter not in self.available:
            raise PlaygroundError(
                'This server has no EAGLE head for its model, so the drafter must be "medusa" or "lookup" '
                "(or left empty)."
            )
        return drafter

    def head(self, drafter: str, numerics: str) -> EagleHead | None:
        if drafter != "eagle":
            return None
        if numerics not in self.eagles:
            raise PlaygroundError(
                f"The EAGLE head is loaded for {', '.join(self.eagles)} only; pick that Numerics or the Medusa heads."
            )
        return self.eagles[numerics]

    def make(
        self, drafter: str, *, numerics: str, heads: MedusaHeads, tree: Callable[[], MedusaTree], lookup: int
    ) -> Drafter:
        """The core drafter a run's decoders share: ``drafter`` as ``resolve`` gave it, for the copy of
        the model with ``numerics``; ``tree()`` is the checked tree of the run's settings (Medusa heads);
        ``lookup`` the tokens prompt lookup copies a step (the lookup branch's length)."""
        if drafter == "eagle":
            return EagleDrafter(self.head(drafter, numerics))
        if drafter == "lookup":
            return LookupDrafter(lookup)
        return MedusaDrafter(heads, tree())

    def tree_label(self, drafter: str, *, medusa: Callable[[], str], lookup: int, numerics: str | None = None) -> str:
        """The name of the tree ``drafter`` verifies in ``numerics``, as the JSON gives it (``medusa()``: the
        heads' tree's)."""
        if drafter == "eagle":
            t = self.tree_of(numerics)
            return f"eagle-dynamic (top-k {t.top_k}, depth {t.depth}, {t.num_nodes} nodes)"
        if drafter == "lookup":
            return f"prompt-lookup chain (up to {lookup} tokens)"
        return medusa()

    def note_of(self, drafter: str) -> str:
        """What the tree controls mean under ``drafter`` ("": the Medusa heads use them)."""
        if drafter == "eagle":
            head = next(iter(self.eagles.values()), None)
            about = getattr(head, "about", "")
            int8 = [n for n, h in self.eagles.items() if getattr(h, "int8", False)]  # the numerics drafting in int8
            if int8:
                about += (
                    f" In {' and '.join(int8)} it drafts in int8 here (its projection, attention and MLP); "
                    "decoding stays exact."
                )
            return tree_note(self.tree) + (f" {about}" if about else "")
        if drafter == "lookup":
            return (
                "Prompt lookup copies the tokens that followed the latest earlier occurrence of the text's last "
                "4, 3 or 2 tokens, verified as one chain (no weights, exact like every drafter): the tree preset, "
                "the custom tree and the lookup switch apply to the Medusa heads only."
            )
        return ""


def make_drafters(eagles: dict, *, defaults, device, device_label: str) -> Drafters:
    """The Drafters of a Playground: the default by ``default_drafter`` from the recorded figures."""
    if not eagles:
        return Drafters({}, "medusa")
    record = eagle_record(next(iter(eagles.values())), device)
    eagle = float(record["speedup"]) if record else None
    if record and record.get("medusa_speedup"):  # both drafters measured in one bench run: the ratio the rules ask for
        medusa = float(record["medusa_speedup"])
        dtype = str(record.get("dtype", "")).removeprefix("torch.")
        branch = ""
        if record.get("lookup_speedup"):  # each drafter with the lookup branch beside its tree, as the page runs them
            eagle, branch = float(record["lookup_speedup"]), ", each with the lookup branch"
        drafts = f", {record['draft']} drafts" if record.get("draft") in ("int8", "float") else ""
        source = f"measured in one bench run ({dtype}{drafts}, {record.get('date', 'undated')}{branch})"
    else:  # two records, perhaps of two machines or numerics: said so
        medusa = medusa_speedup(defaults, device)
        source = "recorded separately (the heads' calibration and the EAGLE head's bench, perhaps on other machines)"
    chosen = default_drafter(medusa, eagle)
    return Drafters(dict(eagles), chosen, default_reason(chosen, medusa, eagle, device=device_label, source=source))


def drafter_label(drafter: str | None) -> str:
    return DRAFTER_NAMES.get(drafter or "", "")


def tree_note(tree: DynamicTreeConfig | None) -> str:
    """What the tree controls mean under the EAGLE drafter."""
    if tree is None:
        return ""
    return (
        "The EAGLE head grows its own dynamic tree every step "
        f"(top-k {tree.top_k}, depth {tree.depth}, {tree.num_nodes} nodes besides the root): "
        "the tree preset and the custom tree apply to the Medusa heads only; the lookup branch still sits beside it."
    )


# ---------------------------------------------------------------------- the Tree lab's sweep
@dataclass(frozen=True)
class BudgetPoint:
    nodes: int  # nodes verified per step besides the root (the lookup branch aside)
    tokens_per_step: float
    tokens_per_second: float
    speedup: float | None  # tokens/s over plain greedy's, on the same prompt
    acceptance: Acceptance | None = None  # mean acceptance length, rate per draft position (core/spec_metrics.py)


def eagle_budgets(
    pg,
    prompt: str,
    *,
    max_new_tokens: int,
    chat_template: bool = True,
    numerics: str | None = None,
    budgets: Sequence[int] = EAGLE_BUDGETS,
    stop=None,
    progress: Callable[[int, int], None] | None = None,
) -> list[BudgetPoint]:
    """EAGLE greedy with each node budget (its top-k and depth kept), against plain greedy, on the
    prompt, one run after another on this device (the Playground's checks, warm-up and timing;
    no lookup branch, so the points show the drafter alone). ``progress(done, total)`` after each run."""
    settings = pg.settings(
        max_new_tokens, 0.0, 0.09, 0.3, None, "", chat_template, False, numerics=numerics, drafter="eagle"
    )
    ids, decoders = pg.prepare(prompt, settings)
    plain, eagle = decoders["plain"], decoders["medusa-greedy"]
    base = eagle.drafter.tree
    runs = {0: plain} | {
        n: Decoder(
            eagle.model,
            method="medusa-greedy",
            drafter=EagleDrafter(eagle.drafter.head, replace(base, num_nodes=min(n, base.num_candidates))),
            config=eagle.config,
        )
        for n in budgets
    }
    pg.warmup(ids, [plain, eagle])
    results, total = {}, len(runs)
    for done, (n, dec) in enumerate(runs.items(), 1):
        events = list(pg.run_method("plain" if n == 0 else "medusa-greedy", dec, ids, stop=stop))
        results[n] = events[-1].record.result
        if progress is not None:
            progress(done, total)
    ref = results.pop(0)
    if any(r.decode_steps == 0 for r in results.values()):
        raise PlaygroundError(
            "The run ended at its prefill, so there is no EAGLE step to measure; "
            "raise Max new tokens and measure again."
        )
    base_tps = ref.tokens_per_second if ref.decode_steps else 0.0
    return [
        BudgetPoint(
            runs[n].drafter.tree.num_nodes,
            r.tokens_per_step,
            r.tokens_per_second,
            r.tokens_per_second / base_tps if base_tps > 0 else None,
            step_acceptance(r.steps, depth=draft_positions(runs[n])),
        )
        for n, r in results.items()
    ]


__all__ = [
    "BudgetPoint",
    "DRAFTERS",
    "DRAFTER_NAMES",
    "Drafters",
    "EAGLE_BUDGETS",
    "check_eagle_folder",
    "default_drafter",
    "default_reason",
    "drafter_label",
    "eagle_beside",
    "eagle_budgets",
    "eagle_record",
    "eagle_speedup",
    "find_eagle",
    "load_eagle_for",
    "load_medusa",
    "make_drafters",
    "medusa_speedup",
    "tree_note",
    "untrained_heads",
]
