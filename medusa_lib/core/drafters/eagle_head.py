"""An EAGLE head as a drafter: a new EAGLE-2 dynamic tree every step (Li et al. 2024).

The head's one decoder layer reads the embedding of the token chosen at t + 1 beside the base
model's feature f_t and drafts autoregressively at the feature level (``core/eagle.py``), growing
a new dynamic tree each step (``core/dynamic_tree.py``). It ships beside the Medusa heads
(``<heads>-eagle``) or in a folder the operator names (``--eagle``).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import torch

from ..defaults import device_kind, record_kind
from ..draft import DraftState, NewTree
from ..dynamic_tree import DynamicTreeConfig, as_medusa_tree
from ..eagle import CONFIG_FILE, EAGLE_FILE, EagleError, EagleHead, check_sizes
from ..eagle_io import is_eagle_folder, load_eagle, read_eagle_config
from ..eagle_run import EagleRun
from ..eagle_static import StaticEagle
from ..file_checks import safetensors_problem
from ..messages import cause
from ..tree.parents import tree_of_parents
from .base import Draft, Drafter, DraftRun, Loaded, StaticDraft, beside, no_context

# the EAGLE head of heads folder X lives in X-eagle
SUFFIX = "-eagle"


def eagle_beside(heads: str | Path | None) -> Path | None:
    """Where the EAGLE head of a Medusa heads folder lives: the folder's name + ``-eagle``, beside it."""
    return beside(heads, SUFFIX)


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
        # a damaged config.json or weights file, before any model loads
        read_eagle_config(path)
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


def read_eagle_files(folder: Path):
    """The EAGLE head's files read without a model (its config, its weights' header and size): its config, or its
    sentence."""
    cfg = read_eagle_config(folder)
    problem = safetensors_problem(folder / EAGLE_FILE)
    if problem:
        raise EagleError(
            f"The EAGLE weights {folder / EAGLE_FILE} are not a readable safetensors file ({problem}); "
            "copy the EAGLE head again or train a new one."
        )
    return cfg


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
        # its own files: damaged or not
        read_eagle_files(folder)
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
    except (ValueError, OSError, RuntimeError) as e:
        # a damaged file the checks above missed: one sentence
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


def tree_note(tree: DynamicTreeConfig | None) -> str:
    """What the tree controls mean under the EAGLE drafter."""
    if tree is None:
        return ""
    return (
        "The EAGLE head grows its own dynamic tree every step "
        f"(top-k {tree.top_k}, depth {tree.depth}, {tree.num_nodes} nodes besides the root): "
        "the tree preset and the custom tree apply to the Medusa heads only; the lookup branch still sits beside it."
    )


class _EagleRun(DraftRun):
    def __init__(self, drafter: "EagleDrafter"):
        self.d, self.run, self.pending = drafter, EagleRun(drafter.head, drafter.tree), []
        self.inputs, self.hooks = {}, []
        # EAGLE-3 reads what enters these layers of every forward
        for k in drafter.head.config.fuse_layers or ():
            hook = lambda module, args, kwargs, k=k: self.inputs.__setitem__(  # noqa: E731
                k, (args[0] if args else kwargs["hidden_states"])[0].detach()
            )
            self.hooks.append(drafter.layers[k].register_forward_pre_hook(hook, with_kwargs=True))

    def verified(self, features, tokens, start, rows=None):
        # pairs (f_t, x_{t+1}), read before the next draft; EAGLE-3: the fused layer inputs at the
        # same rows of the same forward, [n, layers, d]
        if self.hooks:
            fused = torch.stack([self.inputs[k] for k in self.d.head.config.fuse_layers], dim=-2)
            features = fused if rows is None else fused[rows.to(fused.device)]
        self.pending.append((features, tokens, start))

    def close(self):
        for hook in self.hooks:
            hook.remove()
        self.hooks = []

    def propose(self, root, *, history, seq_len):
        # the verified features replace what the drafter drafted there
        if self.pending:
            features, tokens = (torch.cat([p[i] for p in self.pending]) for i in (0, 1))
            self.run.extend(features, tokens, self.pending[0][2])
            self.pending = []
        tree = self.run.draft(root)
        return Draft(as_medusa_tree(tree, top_k=self.d.tree.top_k), tree.tokens)


class EagleDrafter(Drafter):
    """The EAGLE head (``eagle.py``): a new EAGLE-2 dynamic tree every step from features and tokens."""

    name = "eagle"
    label = "EAGLE head"
    drafted_by = "the EAGLE head"
    order = 1
    records = "the EAGLE head's config.json"
    # what the page's "How to read this page" says about it
    teach = (
        "The EAGLE head ([Li et al., 2024](https://arxiv.org/abs/2401.15077)) is one small decoder layer that "
        "is fed what the heads never see: the embedding of the token actually chosen at t+1 together with the "
        "base model's feature f_t. It runs autoregressively at the feature level, feeding its own predicted "
        "feature back in beside the token it drafted, so each deeper draft knows which token was picked "
        "before it. It also scores its guesses as it goes and grows a new tree every step (EAGLE-2's *dynamic "
        "tree*: the best few continuations per level, then the best N nodes overall), so the inspector's tree "
        "changes shape from step to step and the tree preset does not apply to it."
    )
    option = (
        "EAGLE head folder for the page's Drafter choice, 'auto' (the one beside the Medusa heads, "
        "<heads>-eagle, if any; default) or 'none' (no EAGLE head)"
    )

    def __init__(self, head: EagleHead, tree: DynamicTreeConfig | None = None):
        self.head, self.tree = head, tree if isinstance(tree, DynamicTreeConfig) else head.config.tree
        self.tree.check()
        self.depth = self.tree.depth

    @classmethod
    def check_option(cls, option, *, folder=None) -> None:
        find_eagle(option, heads=folder)

    @classmethod
    def check_files(cls, option, *, folder=None, sizes=None) -> str | None:
        where, named = find_eagle(option, heads=folder)
        if where is None:
            return None
        try:
            cfg = read_eagle_files(where)
            if sizes is not None:
                check_sizes(cfg, *sizes)
        except EagleError as e:
            if named:
                raise EagleError(f"--eagle {str(where)!r}: {e}") from None
            return f"The EAGLE head beside the Medusa heads is left out, so the Medusa heads draft: {e}"
        return None

    @classmethod
    def load(cls, model, *, heads=None, folder=None, option=None) -> Loaded:
        """The head beside the Medusa heads' ``folder`` (``option`` "auto"), the one the operator
        named (``option``: a folder; it must load: EagleError), or none ("none")."""
        where, named = find_eagle(option, heads=folder)
        head, note = load_eagle_for(where, model, named=named)
        return Loaded(head, note or f"the head from {where}")

    @classmethod
    def for_run(cls, state, *, heads, tree, lookup):
        return cls(state)

    @classmethod
    def recorded(cls, state, *, defaults, device):
        """The head's ``calibration`` record (bench --record-eagle) made on this kind of device; where
        it holds the Medusa heads' figure from the same bench run, both come from there."""
        record = getattr(state, "calibration", None)
        if not isinstance(record, dict) or not record.get("speedup") or record_kind(record) != device_kind(device):
            return None, {}, ""
        if not record.get("medusa_speedup"):
            return float(record["speedup"]), {}, "the EAGLE head's bench"
        speedup, branch = float(record["speedup"]), ""
        # each drafter with the lookup branch beside its tree, as the page runs them
        if record.get("lookup_speedup"):
            speedup, branch = float(record["lookup_speedup"]), ", each with the lookup branch"
        dtype = str(record.get("dtype", "")).removeprefix("torch.")
        drafts = f", {record['draft']} drafts" if record.get("draft") in ("int8", "float") else ""
        source = f"measured in one bench run ({dtype}{drafts}, {record.get('date', 'undated')}{branch})"
        return speedup, {"medusa": float(record["medusa_speedup"])}, source

    @classmethod
    def about(cls, states: dict) -> str:
        # the tree of the float32 copy, the page's first numerics, where loaded (each copy has its own)
        head = states.get("float32") or next(iter(states.values()), None)
        about = getattr(head, "about", "")
        # the numerics drafting in int8
        int8 = [n for n, h in states.items() if getattr(h, "int8", False)]
        if int8:
            about += (
                f" In {' and '.join(int8)} it drafts in int8 here (its projection, attention and MLP); "
                "decoding stays exact."
            )
        tree = head.config.tree if head is not None else None
        return tree_note(tree) + (f" {about}" if about else "")

    def tree_label(self) -> str:
        t = self.tree
        return f"eagle-dynamic (top-k {t.top_k}, depth {t.depth}, {t.num_nodes} nodes)"

    def _bind(self, dec) -> None:
        self.head.check_fits(dec.model)
        self.layers = dec.model.base_model.layers

    def open(self) -> DraftRun:
        return _EagleRun(self)

    @property
    def static_note(self) -> str:
        return (
            "An EAGLE-3 head (it reads the inputs of several layers) runs with the dynamic cache only; "
            "this run uses the dynamic cache."
        )

    def static(self, dec) -> StaticDraft | None:
        """The head's draft inside the step's program (``eagle_static.StaticEagle``): a new tree of
        the same size every step, written as parents. An EAGLE-3 head reads other layers' inputs
        through hooks, which a captured step does not run: dynamic cache only (``static_note``)."""
        if self.head.config.fuse_layers:
            return None
        head, tree = self.head, self.tree
        # its projection onto the proposal vocabulary, gathered now (a traced step reads it as it is)
        head.logits(torch.zeros(head.config.hidden_size, dtype=head.fc.weight.dtype, device=head.fc.weight.device))

        # the records read a step's tree back from its parents
        describe = partial(tree_of_parents, width=tree.depth + 1, top_k=tree.top_k)

        def made(eagle: StaticEagle) -> StaticDraft:
            return StaticDraft(
                NewTree(eagle.parents, tree.depth, tree.top_k, describe),
                lambda hidden, root, history, seq_len: no_context(eagle.draft(root)),
                # the head, its tree and its projection (proposal vocabulary, numerics): what the program holds
                ("eagle", head, tree, head._proj),
                state=DraftState(eagle.verified, eagle.start, fresh),
            )

        def fresh(max_len: int) -> StaticDraft:
            eagle = StaticEagle(head, tree)
            eagle.allocate(max_len)
            return made(eagle)

        # what keys and sizes the program; each program drafts with a fresh one
        return made(StaticEagle(head, tree))


__all__ = ["EagleDrafter", "check_eagle_folder", "eagle_beside", "find_eagle", "load_eagle_for", "tree_note"]
