"""HTML for the token columns, their live statistics, the exactness badge, the sampling panel and the colour legend.

Generated text is untrusted: every token goes through html.escape, so a model that writes
``<script>`` shows the characters, never runs them.
"""

from __future__ import annotations

import html
import re
from typing import Sequence

from medusa_lib.present import DRAFTED_BY, DRAFTER_NAMES, LABELS, NOT_TIMED, GreedyCheck, Piece, RunRecord

# Okabe-Ito, by column
METHOD_COLORS = {
    "plain": "#555555",
    "medusa-greedy": "#0072B2",
    "medusa-typical": "#D55E00",
    "plain-sample": "#555555",
    "medusa-sample": "#0072B2",
}
# the blinking block after a running (or replaying) column's text
CURSOR = '<span class="cursor">&#9646;</span>'
# top right of a column
STATE_BADGES = {
    "waiting": "waiting",
    "running": "running&hellip;",
    "done": "done",
    "replay": "replay",
    "stopped": "stopped",
}


# what makes Markdown format inline text (emphasis, code, links and images, strike-through, tables, headings);
# a backslash before any of them shows the character itself
MARKDOWN_MARKS = re.compile(r"([\\`*_\[\]#~|!])")


def literal_markdown(text: str) -> str:
    """Text the user typed (a preset name, a custom tree) inside a Markdown line, shown as typed: HTML
    escaped and Markdown's marks backslash-escaped, so *bold*, `code` or [a](http://x) is not formatting."""
    return MARKDOWN_MARKS.sub(r"\\\1", html.escape(text, quote=False))


def tokens_html(pieces: Sequence[Piece]) -> str:
    """One span per token. Drafted tokens accepted in a step share a highlight; the shade alternates
    from step to step (h0 / h1) so that neighbouring multi-token steps stay distinguishable."""
    out = []
    for p in pieces:
        if not p.text:
            continue
        cls = {"draft": f"tok head h{p.step % 2}", "lookup": f"tok lookup l{p.step % 2}"}.get(p.origin, "tok base")
        what = {
            "draft": "accepted drafted token",
            "lookup": "accepted lookup-branch token (n-gram from the context)",
        }.get(p.origin, "base model's own token")
        out.append(f'<span class="{cls}" title="step {p.step}: {what} (id {p.token_id})">{html.escape(p.text)}</span>')
    return "".join(out)


def stats_line(record: RunRecord | None, *, reference: RunRecord | None = None) -> str:
    """tokens/s, tokens/step and the run's size; with the ``reference`` run (plain, finished), the
    speed-up = tokens/s over the reference's, first (``data-speedup`` holds it for tests)."""
    if record is None or not record.views:
        return "tokens/s &mdash; &middot; tokens/step &mdash;"
    r = record.result
    tps = f"{r.tokens_per_second:.1f}" if r.decode_steps else "&mdash;"
    tpstep = f"{r.tokens_per_step:.2f}" if r.decode_steps else "&mdash;"
    speed = ""
    if reference is not None and reference is not record and r.decode_steps and reference.result.tokens_per_second > 0:
        x = r.tokens_per_second / reference.result.tokens_per_second
        speed = f'<span class="speedup" data-speedup="{x:.2f}"><b>{x:.2f}&times;</b> plain</span> &middot; '
    return (
        f"{speed}<b>{tps}</b> tokens/s &middot; <b>{tpstep}</b> tokens/step &middot; "
        f"{len(r.tokens)} token{'' if len(r.tokens) == 1 else 's'} in {record.elapsed:.2f} s"
    )


def column_html(
    method: str,
    record: RunRecord | None,
    *,
    state: str = "waiting",
    pieces: Sequence[Piece] | None = None,
    reference: RunRecord | None = None,
) -> str:
    """A method's column: title, live statistics (the speed-up over ``reference``, the finished plain
    run, when given), the run's note, then its text. state: waiting | running | done | replay | stopped."""
    if pieces is None:
        pieces = record.pieces if record is not None else []
    badge = STATE_BADGES.get(state, html.escape(state))
    cursor = CURSOR if state in ("running", "replay") else ""
    body = tokens_html(pieces) + cursor or '<span class="placeholder">(output appears here)</span>'
    note = f'<div class="method-note">{html.escape(record.note)}</div>' if record is not None and record.note else ""
    # who drafted this column's trees (Medusa columns only)
    drafter = record.drafter if record is not None else None
    tag = (
        f'<span class="method-drafter" data-drafter="{drafter}">drafted by {DRAFTED_BY[drafter]}</span>'
        if drafter in DRAFTER_NAMES
        else ""
    )
    return (
        f'<div class="method-col" style="--method-color:{METHOD_COLORS[method]}" data-method="{method}" '
        f'data-state="{state}">'
        f'<div class="method-head"><span class="method-name">{LABELS[method]}</span>{tag}<span '
        f'class="method-state">{badge}</span></div>'
        f'<div class="method-stats">{stats_line(record, reference=reference)}</div>{note}'
        f'<div class="method-text">{body}</div></div>'
    )


def stopped_column(col: str | None) -> str | None:
    """A column as the browser holds it when Stop is pressed: one still running (or replaying) now says
    'stopped' and loses its cursor; its tokens and statistics stay. Tokens are escaped, so the markers
    replaced here can only be the column's own."""
    if not isinstance(col, str):
        return col
    for state in ("running", "replay"):
        marker = f'data-state="{state}"'
        if marker in col:
            badge = f'<span class="method-state">{STATE_BADGES[state]}</span>'
            col = col.replace(marker, 'data-state="stopped"', 1).replace(
                badge, f'<span class="method-state">{STATE_BADGES["stopped"]}</span>', 1
            )
            return col.replace(CURSOR, "")
    return col


def badge_html(
    check: GreedyCheck | None, *, plain: RunRecord | None = None, medusa: RunRecord | None = None, tokenizer=None
) -> str:
    """Green when Medusa greedy (exact sampling) reproduced plain greedy (sampling, same seed) token for
    token; else the first differing position, amber when the base model's choice there was a
    floating-point tie, red otherwise. ``numerics`` (e.g. "bfloat16") is said in the badge."""
    if check is None:
        return (
            '<div class="badge badge-wait" data-equal="unknown">Exactness check: '
            "compares the tokens of the first two columns "
            "(Medusa greedy against plain greedy, or Medusa exact sampling against plain sampling with the same "
            "seed).</div>"
        )
    sampled = f' data-sampled="{str(check.sampled).lower()}"'
    if check.equal:
        return f'<div class="badge badge-ok" data-equal="true"{sampled}>&#10004; {html.escape(check.message)}</div>'
    detail = ""
    if tokenizer is not None and plain is not None and medusa is not None:
        i = check.first_diff
        a = plain.tokens[i : i + 1]
        b = medusa.tokens[i : i + 1]
        show = lambda ids: repr(tokenizer.decode(ids)) if ids else "(end)"  # noqa: E731
        detail = f" Plain has {html.escape(show(a))}, {check.names[0]} has {html.escape(show(b))}."
    # A floating-point tie is amber, a real difference red.
    kind, mark = ("badge-tie", "&#8776;") if check.tie else ("badge-diff", "&#10008;")
    return (
        f'<div class="badge {kind}" data-equal="false"{sampled} data-tie="{str(check.tie).lower()}" '
        f'data-first-diff="{check.first_diff}">'
        f"{mark} {html.escape(check.headline)}{detail} {html.escape(check.reason)}</div>"
    )


LEGEND_HTML = (
    '<div class="legend">'
    '<span class="tok base">plain text</span> = the base model&#39;s own token (one per step: '
    "the root / bonus token) &nbsp; "
    '<span class="tok head h0">high</span><span class="tok head h1">lighted</span> = drafted tokens (the drafter&#39;s '
    "guesses) the base model accepted in that step "
    "(the shade alternates from step to step, so each multi-token step shows as one block) &nbsp; "
    '<span class="tok lookup l0">under</span><span class="tok lookup l1">lined</span> = lookup-branch tokens the base '
    "model accepted "
    "(what followed an earlier occurrence of the last few tokens)"
    "</div>"
)


def sampling_html(rows: Sequence[dict] | None, *, temperature: float | None = None) -> str:
    """The panel "what typical acceptance costs": the sampled runs' speed and how their tokens score
    under the model at T (``present.sample_rows``); a pointer to it when the runs were greedy."""
    if not rows:
        return (
            '<div class="sampling-panel" data-rows="0"><b>Sampling:</b> set Temperature above 0 and run to compare '
            "plain sampling, "
            "Medusa exact sampling and typical acceptance at that temperature, with the same seed.</div>"
        )
    head = "".join(
        f"<th>{html.escape(c)}</th>"
        for c in ("method", "tokens/step", "tokens/s", "mean log p", "mean entropy", "log p + entropy")
    )
    body = "".join(
        "<tr>"
        + "".join(
            f"<td>{html.escape(str(NOT_TIMED if r[c] is None else r[c]))}</td>"
            for c in ("method", "tokens/step", "tokens/s", "mean log p", "mean entropy", "log p + entropy")
        )
        + "</tr>"
        for r in rows
    )
    t = f" at T = {temperature:g}" if temperature is not None else ""
    return (
        f'<div class="sampling-panel" data-rows="{len(rows)}"><b>What typical acceptance costs, on this prompt{t}</b> '
        "(scores under the model at T, nats per token, from one forward over each output, not timed)"
        f'<table class="sampling-table"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
        '<div class="sampling-note">A true sample from the model has mean log p = &minus;(mean entropy), up to noise: '
        "so plain and exact sampling should show log p + entropy near 0. Typical acceptance keeps a guess whenever the "
        "model gives it "
        "more than min(&epsilon;, &delta;&middot;e<sup>&minus;H</sup>), a bar that favours likely tokens; "
        "a positive log p + entropy "
        "is its text leaning toward the model's mode. Raising &epsilon; and &delta; accepts fewer guesses: slower, "
        "with more of the text "
        "drawn from the model itself.</div></div>"
    )


def info_html(
    *,
    model: str,
    device: str,
    dtype: str,
    heads: int,
    heads_note: str,
    numerics: Sequence[str] = (),
    engine: str = "",
    tree: str = "",
    compiling: str = "",
) -> str:
    """What this server loaded, in one line; under it, where the default tree comes from (``tree``:
    ``HeadsDefaults.why``) and what is being compiled meanwhile (``compiling``: ``PendingEngine.status``)."""
    # untrained heads, or trained heads on weights they were not trained on (hub_gguf.weights_note)
    warn = "untrained" in heads_note or "unmeasured" in heads_note
    note = f'<span class="{"note-warn" if warn else "note"}">{html.escape(heads_note)}</span>'
    more = [n for n in numerics if n != dtype]
    copies = f", and a {', '.join(map(html.escape, more))} copy (the Numerics choice)" if more else ""
    how = f" &middot; {html.escape(engine)}" if engine else ""
    return (
        f'<div class="info-line">Model <b>{html.escape(model)}</b> on <b>{html.escape(device)}</b> '
        f"({html.escape(dtype)}{copies}) &middot; {heads} Medusa heads: {note}{how}</div>"
        + "".join(
            f'<div class="{cls}">{html.escape(text)}</div>'
            for cls, text in (("info-tree", tree), ("info-compiling", compiling))
            if text
        )
    )


def calibration_note_html(note: str) -> str:
    """``HeadsDefaults.note``: the default tree was calibrated on another kind of device than this one."""
    return f'<div class="calibration-note">{html.escape(note)}</div>'


def drafter_note_html(note: str, cls: str) -> str:
    """A line under the Drafter choice: why its default is what it is, or what EAGLE's tree is (``present.drafter``)."""
    return f'<div class="{cls}">{html.escape(note)}</div>' if note else ""


def numerics_note_html(note: str) -> str:
    """``Playground.numerics_note``: what float32 guarantees and how much faster the 16-bit copy decodes here."""
    return f'<div class="numerics-note">{html.escape(note)}</div>'
