"""What the page and the ``/compare`` API may ask for: the settings, their limits and their one check.

A bad value gets one sentence that names the setting and says what to change (``PlaygroundError``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Mapping

from ..core.config import DEFAULT_LOOKUP, MAX_LOOKUP, DecodeConfig, is_lookup_length
from ..core.defaults import FALLBACK_TREE
from ..core.messages import InputError, is_number, kind, must_be, must_be_switch, shown

# the slider's and the API's maximum (app.py: MEDUSA_MAX_NEW_TOKENS_LIMIT)
MAX_NEW_TOKENS_LIMIT = 512
# checked before tokenising: a 1 MB paste is refused at once (~8k tokens of English)
MAX_PROMPT_CHARS = 32_000
# custom tree text; the largest reference tree (63 nodes) is ~700 characters
MAX_TREE_CHARS = 4_000
# a verify step attends over every node: cost grows with the tree's size
MAX_TREE_NODES = 128
# a torch.Generator seed
MAX_SEED = 2**63 - 1
# the least temperature above 0: a normal number in float32 and bfloat16, so (logits - max) / T is never 0 / 0
# (1e-46 rounds to 0 in float32); below it softmax is the argmax's one-hot anyway (core: tempered_probs)
MIN_TEMPERATURE = 1e-30
# wall time one /compare call may take (app.py: MEDUSA_MAX_RUN_SECONDS): bounds a client that left without a word
MAX_RUN_SECONDS = 180.0

# What the three columns run, per mode. Greedy (the page's first view): plain greedy, Medusa greedy
# (== plain greedy) and typical acceptance sampling at T. Sampling (the fair comparison at a
# temperature): plain sampling, Medusa exact sampling (== plain sampling, same seed) and typical
# acceptance, all at T from the same seed. Typical acceptance runs the same way in both modes.
GREEDY_VIEWS = ("plain", "medusa-greedy", "medusa-typical")
SAMPLED_VIEWS = ("plain-sample", "medusa-sample", "medusa-typical")
# the page's Mode choice -> Settings.sample
MODES = {"greedy": False, "sampling": True}
# a view's decoder method, where the names differ
DECODER_METHOD = {"plain-sample": "plain"}


class PlaygroundError(InputError):
    """Settings the playground cannot run with. One sentence that says what to change."""


class RunStopped(InputError):
    """A run ended between two steps: its caller cancelled or left, or it ran past the server's bound."""


def sample_of_mode(mode) -> bool:
    """The page's Mode choice ("greedy" or "sampling") as ``Settings.sample``."""
    if not isinstance(mode, str) or mode not in MODES:
        raise PlaygroundError(f"The mode must be {' or '.join(map(repr, MODES))} (got {shown(mode)}).")
    return MODES[mode]


@dataclass(frozen=True)
class Request:
    """What a page or ``/compare`` request asks for, by the names users type, in ``/compare``'s order; the
    defaults are what a name left out means. An empty or null tree and a null lookup switch, numerics or
    drafter mean the playground's own choice: the heads' default tree and switch (calibrated in the run's
    numerics), float32 where loaded, the faster drafter (``RequestInputs.starting_request`` names them for
    the page's starting values and ``/compare``'s documented defaults). Nothing is checked here: a caller
    may send anything, and ``RequestInputs.settings_of`` and ``Settings.check`` give each bad value its
    sentence."""

    # per method
    max_new_tokens: int = 96
    # typical acceptance's p = softmax(logits / T); in the sampling mode every column's
    temperature: float = 0.7
    # typical acceptance's hard threshold
    epsilon: float = 0.09
    # its entropy-dependent threshold: accept p > min(epsilon, delta * exp(-H))
    delta: float = 0.3
    # a preset's name
    tree: str | None = ""
    # JSON list of paths such as [[0], [0, 0], [1]] (or the list itself); overrides the preset when not empty
    custom_tree: str | list = ""
    # wrap the prompt in the model's chat template
    chat_template: bool = True
    # verify an n-gram copied from the context beside the drafted tree
    lookup_branch: bool | None = None
    # the sampling mode (SAMPLED_VIEWS) instead of the greedy one; the page's Mode choice
    sample: bool = False
    # the generator every sampled method starts from
    seed: int = 0
    # which loaded copy runs, "bfloat16" or "float32"
    numerics: str | None = None
    # who drafts the Medusa columns' trees: a registered drafter's name ("medusa", "eagle", "lookup", "rest")
    drafter: str | None = None

    @classmethod
    def of(cls, named: Mapping) -> "Request":
        """A request from values by name; a name that is not a setting gets its sentence."""
        unknown = sorted(set(named) - set(REQUEST_NAMES), key=str)
        if unknown:
            raise PlaygroundError(f"Unknown setting {unknown[0]!r}; the settings are: {', '.join(REQUEST_NAMES)}.")
        return cls(**named)


# /compare's parameters after the prompt, in order
REQUEST_NAMES = tuple(f.name for f in fields(Request))


@dataclass(frozen=True)
class Settings:
    """What a run uses: a ``Request`` with the playground's choices made (``RequestInputs.settings_of``),
    under the same names, except that the lookup switch has become the branch's length (``lookup``). With
    ``sample`` off (the greedy mode, the default), plain and Medusa greedy decode greedily (T = 0) and only
    typical acceptance uses T; with it on (the sampling mode), all three sample at T from the same seed
    (``SAMPLED_VIEWS``). Typical acceptance samples its root and bonus tokens at T from the seed in both
    modes, as the reference Medusa does (at T = 0 it is greedy). Epsilon and delta are the paper's
    letters; ``config`` hands them to the core under its names (``posterior_threshold``, ``posterior_alpha``).
    The defaults are ``Request``'s; without a playground, the tree is ``FALLBACK_TREE`` and the branch
    ``DEFAULT_LOOKUP`` tokens long."""

    max_new_tokens: int = Request.max_new_tokens
    temperature: float = Request.temperature
    epsilon: float = Request.epsilon
    delta: float = Request.delta
    # a preset's name (the playground's default: the heads', core.defaults)
    tree: str = FALLBACK_TREE
    custom_tree: str = Request.custom_tree
    chat_template: bool = Request.chat_template
    seed: int = Request.seed
    sample: bool = Request.sample
    # Medusa: length of the lookup branch verified beside the tree (0 = off)
    lookup: int = DEFAULT_LOOKUP
    # None: the playground's default (Playground.prepare checks it)
    numerics: str | None = Request.numerics
    # None: the playground's default (drafter.py)
    drafter: str | None = Request.drafter

    def check(self, *, max_new_tokens_limit: int = MAX_NEW_TOKENS_LIMIT) -> None:
        """The check of the settings a page or an API caller sent (``RequestInputs.settings_of`` has
        already turned the lookup switch into a length): types first (true/false and text are not numbers),
        then ranges. Each failure is one sentence naming the setting."""
        whole = f"a whole number from 1 to {max_new_tokens_limit}"
        n = self.max_new_tokens
        if not is_number(n) or int(n) != n or not 1 <= n <= max_new_tokens_limit:
            raise PlaygroundError(must_be("Max new tokens", whole, n))
        for label, value, low, high in (
            ("Temperature", self.temperature, 0, 2),
            ("Epsilon", self.epsilon, 0, 1),
            ("Delta", self.delta, 0, 1),
        ):
            if not is_number(value) or not low <= value <= high:
                raise PlaygroundError(must_be(label, f"between {low} and {high}", value))
        if 0 < self.temperature < MIN_TEMPERATURE:
            raise PlaygroundError(
                must_be("Temperature", f"0 (greedy) or between {MIN_TEMPERATURE:g} and 2", self.temperature)
            )
        if not isinstance(self.sample, bool):
            raise PlaygroundError(must_be_switch("The sampling switch (sample)", self.sample))
        if self.sample and self.temperature == 0:
            raise PlaygroundError(
                "Sampling needs a temperature above 0 (at 0 every method is greedy); "
                "raise Temperature or turn sampling off."
            )
        if not is_number(self.seed) or int(self.seed) != self.seed or not 0 <= self.seed <= MAX_SEED:
            raise PlaygroundError(must_be("The seed", f"a whole number from 0 to {MAX_SEED}", self.seed))
        if not isinstance(self.chat_template, bool):
            raise PlaygroundError(must_be_switch("The chat template switch (chat_template)", self.chat_template))
        if not is_lookup_length(self.lookup):
            raise PlaygroundError(
                must_be("The lookup branch's length", f"a whole number from 0 (off) to {MAX_LOOKUP}", self.lookup)
            )
        if not isinstance(self.tree, str):
            raise PlaygroundError(
                f"The tree preset must be the name of a preset, not {kind(self.tree)} (got {shown(self.tree)})."
            )
        if not isinstance(self.custom_tree, str):
            raise PlaygroundError(
                "The custom tree must be text such as [[0], [0, 0], [1]], "
                f"not {kind(self.custom_tree)} (got {shown(self.custom_tree)})."
            )

    @property
    def views(self) -> tuple[str, str, str]:
        """What the three columns run, left to right (the first is the speed-ups' reference)."""
        return SAMPLED_VIEWS if self.sample else GREEDY_VIEWS

    def config(self, view: str) -> DecodeConfig:
        """The decoder settings of one column. Typical acceptance samples its root and bonus tokens
        at T (as the reference Medusa does) from the seed, in both modes."""
        # typical acceptance always uses T
        sampled = view in SAMPLED_VIEWS
        return DecodeConfig(
            max_new_tokens=int(self.max_new_tokens),
            temperature=float(self.temperature) if sampled else 0.0,
            seed=int(self.seed),
            posterior_threshold=float(self.epsilon),
            posterior_alpha=float(self.delta),
            sample_root=view == "medusa-typical",
            lookup=0 if view in ("plain", "plain-sample") else int(self.lookup),
        )
