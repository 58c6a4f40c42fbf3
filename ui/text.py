"""The words on the page: the header and the explanation for students."""

from medusa_lib.core.drafters import REGISTRY

HEADER = """# Medusa Playground
One model, one prompt, three decoders, one after another on the same device. **Medusa** adds a few
small *heads* that guess the next 2, 3, 4 ... tokens; the base model checks all guesses in **one**
forward pass over a *tree* of candidates and keeps the longest run it agrees with
([Cai et al., 2024](https://arxiv.org/abs/2401.10774))."""

# {why} is filled by why_faster(): the heads' own calibrated figures, never literals that go stale.
EXPLAIN = """
### How to read this page

**The colours in the three columns.** Every decoding *step* is one forward pass of the base model.
- Plain text is a token the base model chose itself. Plain decoding gets exactly one per step.
- A **highlighted** token was *guessed by a Medusa head* and then *accepted* by the base model in the
  same step. After the accepted guesses, the step always adds one more token of the base model's own
  (the *bonus* token, which becomes the *root* of the next tree). The highlight alternates between two
  shades from step to step, so `[guess guess] own` is one step that produced three tokens.
- An **underlined** run came from the *lookup branch* (checkbox in the settings): beside the heads' tree,
  each step also tries the tokens that followed the last earlier place where the text's last 2-4 tokens
  appeared (in the prompt or the answer so far). Answers repeat names, phrases and patterns; there this
  copy is often right where the heads are not. It is checked exactly like the heads' guesses.
- **tokens/step** is the average number of tokens a step produced (1.0 for plain decoding).
  **tokens/s** counts only the decode steps (the prompt's *prefill* is reported apart in the summary).

**What is a tree?** Head *k* proposes its top-10 tokens for position *t+k*. (The embedded heads also read
the tree's root, the base model's own next token, so head 1 guesses the token *after* a known one, and
each deeper head reads the guesses above it on its own branch, so a branch reads like a sentence; plain
Medusa heads see only the hidden state, and every branch then gets the same guesses from head *k*.) A tree is a list of
paths such as `[[0], [0, 0], [1]]`: `[0]` = head 1's best guess, `[0, 0]` = head 1's best guess followed by
head 2's best guess, `[1]` = head 1's second guess. All paths go into the model as one sequence; the
**tree attention mask** lets each node see the prompt (the *prefix* column), the root, its own ancestors
and itself, never a sibling branch. The step inspector draws the tree (accepted path in green, rejected
guesses greyed out; the lookup branch as triangles) and the mask (green = cells on the accepted path).

**Greedy, exact sampling and typical acceptance.** The **Mode** picks the three columns. In *Greedy* mode
(the first view) *Medusa greedy* accepts a guess only if it is exactly the base model's top choice, so its
text must be identical to plain greedy decoding (the badge checks this token by token). In *Sampling* mode
*plain sampling* draws each token from the model's distribution at the temperature; *Medusa exact sampling*
makes the same draw at the root of the tree and walks down while the drawn token is one of the guesses, so
every token it writes is a true sample, the very one plain sampling draws from the same **seed** (the badge
checks this too). In both modes *Medusa typical* samples at the temperature and accepts a guess whose
probability p is above `min(epsilon, delta * exp(-H))`, where H is the entropy of the base model's prediction:
when the model is unsure (large H) more guesses pass. It is faster, but its text is not plain decoding's and
not a sample any more: the panel under the badge (Sampling mode) shows how far its tokens lean toward the
model's likely ones. Raising epsilon and delta raises that bar, so fewer guesses pass (slower) and more of the
text is drawn from the model itself; lowering them does the opposite.

{drafters}

**Numerics.** The comparison starts in float32, where both identities hold on every prompt. The 16-bit copy
is faster, but a tree step and a one-token step add up their numbers in different orders, so where the
model's two best tokens nearly tie, the rounding may make Medusa pick the other one (the badge then shows
where and why).

{why}
"""


def why_faster(calibration: dict | None, *, default_tree: str | None, lookup: int | None) -> str:
    """The "why not always faster" paragraph, with the heads' own measured figures when they have a
    calibration for their default tree (``python -m medusa_lib.pipeline.calibrate``), so the page
    never quotes numbers that a recalibration made stale. ``calibration`` is the record the page's
    tree comes from (``HeadsDefaults.calibration``: this device kind's, or the one borrowed from
    another kind, whose device the paragraph names)."""
    why = (
        "**Why is Medusa not always faster here?** A step that verifies a tree of guesses costs more than a "
        "one-token step, and more for bigger trees. Medusa wins when the heads are accurate enough that the "
        "extra tokens per step outweigh the extra cost per step."
    )
    calibration = calibration or {}
    tree = (calibration.get("trees") or {}).get(default_tree or "")
    if tree and tree.get("speedup") and tree.get("measured_tokens_per_step"):
        per_step, speedup = tree["measured_tokens_per_step"], tree["speedup"]
        # the branch the figures were measured with
        lookup = calibration.get("lookup", lookup)
        branch = f", with a lookup branch of {lookup}" if lookup else ""
        nodes = f", {tree['nodes']} nodes" if tree.get("nodes") else ""
        heads_only = tree.get("heads_only_simulated_tokens_per_step")
        alone = f" ({heads_only:.1f} from the heads alone, simulated)" if heads_only else ""
        dtype = str(calibration.get("dtype", "")).replace("torch.", "")
        where = (
            f"{dtype + ', ' if dtype else ''}on {calibration.get('device') or 'the machine they were calibrated on'}"
        )
        why += (
            f" When these heads were calibrated ({where}), "
            f"a step of their default tree ({default_tree}{nodes}{branch}) cost about {per_step / speedup:.1f}x "
            f"a one-token step and made {per_step:.1f} tokens a step{alone}: {speedup:.2f}x plain decoding's speed."
        )
    return why + (
        " With *untrained heads* almost every guess is rejected and Medusa is slower: "
        "the baseline trained heads must beat."
    )


def explain(
    calibration: dict | None = None,
    *,
    default_tree: str | None = None,
    lookup: int | None = None,
    drafter_note: str = "",
) -> str:
    """How to read the page, for students (figures from the heads' calibration, if any; ``drafter_note``:
    why the Drafter choice starts where it does, ``Playground.drafters.note``)."""
    return EXPLAIN.format(
        why=why_faster(calibration, default_tree=default_tree, lookup=lookup), drafters=drafters_text(drafter_note)
    )


NUMBERS = {2: "Two", 3: "Three", 4: "Four", 5: "Five", 6: "Six"}


def drafters_text(drafter_note: str) -> str:
    """The paragraph on the Drafter choice: every registered drafter's own words (``Drafter.teach``)."""
    labels = [cls.label for cls in REGISTRY.values()]
    n = len(labels)
    names = ", ".join(labels[:-1]) + f" or {labels[-1]}"
    teach = " ".join(cls.teach for cls in REGISTRY.values() if cls.teach)
    word = NUMBERS.get(n, str(n))
    return (
        f"**{word} drafters: {names}.** The **Drafter** choice picks who proposes the tree that the Medusa "
        f"columns verify (the plain column never drafts). {teach} Verification, acceptance and the badge are the "
        f"same for all {word.lower()}: a drafter changes the speed, never what Medusa greedy writes. {drafter_note}"
    )
