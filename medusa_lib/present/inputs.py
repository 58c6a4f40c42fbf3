"""What a page or a ``/compare`` caller sent, read and checked before anything runs.

A caller's values, by name (a :class:`Request`), become the :class:`Settings` a run uses (``settings_of``); the
tree preset or custom tree becomes a :class:`MedusaTree` (``resolve_tree``); the numerics name
picks the (model, heads) copy a run uses (``pair``); a prompt is checked before it is tokenised
(``check_prompt``). Every bad value gets one sentence that says what to change (PlaygroundError).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Mapping

from ..core.messages import kind, must_be_switch, shown
from ..core.model import model_info
from ..core.tree.presets import get_tree, parse_choices, preset_names
from ..core.tree.shape import MedusaTree, build_tree
from .settings import MAX_TREE_CHARS, MAX_TREE_NODES, PlaygroundError, Request, Settings


class RequestInputs:
    """The Playground's input checks (a mixin): they read its ``variants``, ``default_numerics``,
    ``heads``, ``defaults``, ``defaults_for``, ``drafters``, ``tree_presets`` and its limits."""

    def pair(self, settings: Settings | None) -> tuple:
        """The (model, heads) a run uses: its settings' numerics, or the default (float32 where loaded)."""
        numerics = (
            settings.numerics if settings is not None and settings.numerics is not None else self.default_numerics
        )
        return self.variants[numerics]

    def check_numerics(self, numerics) -> None:
        if numerics is None:
            return
        names = ", ".join(self.variants)
        if not isinstance(numerics, str):
            raise PlaygroundError(
                f"Numerics must be the name of one of: {names}, not {kind(numerics)} (got {shown(numerics)})."
            )
        if numerics not in self.variants:
            raise PlaygroundError(f"Numerics must be one of: {names} (got {shown(numerics)}).")

    def prompt_limit_note(self) -> str:
        """The line the page shows by the prompt: the longest prompt this server takes."""
        if self.max_prompt_tokens is not None:
            return f"Up to {self.max_prompt_tokens:,} tokens on this server ({self.prompt_limit_why})."
        return f"Up to the model's context, {model_info(self.model).context_limit:,} tokens."

    def tree_names(self) -> list[str]:
        return list(self.tree_presets) + [n for n in preset_names() if n not in self.tree_presets]

    def starting_request(self, max_new_tokens: int = Request.max_new_tokens) -> Request:
        """What the page shows first and what ``/compare`` documents as its defaults: ``Request``'s defaults
        with the playground's own choices named (the heads' default tree and lookup switch, the default
        numerics and drafter) and ``max_new_tokens`` within this server's limit."""
        return replace(
            Request(),
            max_new_tokens=min(max_new_tokens, self.max_new_tokens_limit),
            tree=self.defaults.tree,
            lookup_branch=self.defaults.lookup_on,
            numerics=self.default_numerics,
            drafter=self.drafters.default,
        )

    def settings_of(self, request: Request | Mapping) -> Settings:
        """The settings a run uses, from what the page or a ``/compare`` caller sent: a ``Request``, or its
        values by name (a name left out: ``Request``'s default). An empty preset means the heads' default tree
        (calibrated in the run's numerics: ``defaults_for``), a list of paths is taken as the custom tree (as
        JSON text), the lookup switch becomes the heads' branch length or 0. Only what these conversions need
        is checked here (the switch must be true, false or null, the list must be writable as text);
        ``prepare`` checks the rest."""
        r = request if isinstance(request, Request) else Request.of(request)
        custom_tree = r.custom_tree
        # an API caller may send the paths themselves
        if isinstance(custom_tree, list):
            try:
                custom_tree = json.dumps(custom_tree)
            except (TypeError, ValueError, RecursionError):
                # nested too deep to write back as text
                raise PlaygroundError(
                    "The custom tree is nested too deeply; send a flat list of paths like [[0], [0, 0], [1]]."
                ) from None
        if r.lookup_branch is not None and not isinstance(r.lookup_branch, bool):
            raise PlaygroundError(must_be_switch("The lookup branch switch (lookup_branch)", r.lookup_branch))
        # checked later
        numerics = r.numerics if isinstance(r.numerics, str) and r.numerics else None
        # the tree calibrated in the run's numerics
        defaults = self.defaults_for(numerics)
        lookup_on = defaults.lookup_on if r.lookup_branch is None else r.lookup_branch
        return Settings(
            max_new_tokens=r.max_new_tokens,
            temperature=r.temperature,
            epsilon=r.epsilon,
            delta=r.delta,
            tree=r.tree if r.tree not in (None, "") else defaults.tree,
            custom_tree="" if custom_tree is None else custom_tree,
            chat_template=r.chat_template,
            lookup=defaults.lookup if lookup_on else 0,
            sample=r.sample,
            seed=r.seed,
            numerics=r.numerics if r.numerics != "" else None,
            drafter=r.drafter if r.drafter != "" else None,
        )

    def resolve_tree(self, settings: Settings) -> MedusaTree:
        K = self.heads.num_heads
        custom = settings.custom_tree
        if custom.strip():
            if len(custom) > MAX_TREE_CHARS:
                raise PlaygroundError(
                    f"The custom tree text has {len(custom):,} characters; "
                    f"the limit is {MAX_TREE_CHARS:,}: list fewer nodes."
                )
            choices = parse_choices(custom)
            if len(choices) > MAX_TREE_NODES:
                raise PlaygroundError(
                    f"The custom tree has {len(choices)} nodes; the limit is {MAX_TREE_NODES}: remove some nodes."
                )
            return build_tree(choices, num_heads=K, name="custom")
        if settings.tree not in self.tree_names():
            raise PlaygroundError(
                f"Unknown tree preset {shown(settings.tree)}; choose one of: {', '.join(self.tree_names())}."
            )
        return get_tree(settings.tree, num_heads=K, extra=self.tree_presets)

    def check_prompt(self, prompt: str) -> None:
        """Cheap checks before tokenising: a huge paste is refused without spending CPU on it."""
        if prompt is not None and not isinstance(prompt, str):
            raise PlaygroundError(f"The prompt must be text, not {kind(prompt)}.")
        if not prompt or not prompt.strip():
            raise PlaygroundError("The prompt is empty; type a question or pick an example.")
        if len(prompt) > self.max_prompt_chars:
            raise PlaygroundError(
                f"The prompt has {len(prompt):,} characters; the limit is {self.max_prompt_chars:,}: shorten it."
            )
        bad = next((i for i, ch in enumerate(prompt) if "\ud800" <= ch <= "\udfff"), None)
        # half of a UTF-16 pair: no tokenizer can encode it
        if bad is not None:
            raise PlaygroundError(
                f"The prompt has an invalid character at position {bad + 1:,} "
                f"(U+{ord(prompt[bad]):04X}, half of a UTF-16 pair); delete it or paste the text again."
            )
