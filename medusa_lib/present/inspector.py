"""The step inspector's data: a Medusa step's candidate tree, its attention mask, the accepted paths.

Pure functions of the immutable records the playground yields (no UI, no gradio): the app turns
them into plotly figures and tables. A tree node's kind (its dict's "kind") names one of ``NODE_KINDS``,
the records that say how the page draws, names and describes each kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from ..core.drafters import REGISTRY
from .page import DRAFTER_NAMES

if TYPE_CHECKING:
    from .records import RunRecord, StepView


# Okabe-Ito bluish green: the accepted path (its nodes, edges and mask cells)
ACCEPTED = "#009E73"
REJECTED, ROOT, BONUS = "#B8B8B8", "#222222", "#555555"
# Okabe-Ito reddish purple: the lookup branch's rejected nodes
LOOKUP = "#CC79A7"
# Okabe-Ito blue: a node of a tree not run yet (the tree lab's editor)
NODE = "#0072B2"


@dataclass(frozen=True)
class NodeStyle:
    """How the tree figure draws the nodes of one kind in one state: their legend entry and their marker."""

    legend: str
    color: str
    size: int
    symbol: str
    # below 1: dimmed, with a smaller grey label
    opacity: float = 1.0


@dataclass(frozen=True)
class NodeKind:
    """One kind of tree node (``tree_nodes``' and the editor's "kind"): how the page draws, names and describes it.

    accepted    its style (on the accepted path, for a kind that can be off it)
    rejected    its style off the accepted path; None: one style whatever the path
    head_depth  whether its depth is a head's (the lookup branch's is the context's, no head's)
    place       where it sits, in words, for its hover (format fields: the node's dict); None: as its drafter's
                levels say (a head and rank, or a drafter's depth and rank among siblings)
    token       whether it carries a token (an edited tree's nodes, before any run, do not)
    in_column   whether it sits in its depth's column (the bonus token sits between two)
    """

    name: str
    accepted: NodeStyle
    rejected: NodeStyle | None = None
    head_depth: bool = True
    place: str | None = None
    token: bool = True
    in_column: bool = True

    @property
    def styles(self) -> tuple[tuple[NodeStyle, bool | None], ...]:
        """(style, the nodes' accepted state it draws; None: any), in the legend's order: rejected first."""
        if self.rejected is None:
            return ((self.accepted, None),)
        return ((self.rejected, False), (self.accepted, True))

    def where(self, node: dict) -> str:
        """The node's place in words (its hover's last line)."""
        if self.place is not None:
            return self.place.format(**node)
        if node.get("level", "head") != "head":
            return f"{node.get('drafted_by', '')} draft, depth {node['depth']}, rank {node['rank']} among its siblings"
        return f"head {node['depth']}, rank {node['rank']}"


# every kind, in the tree figure's legend order
NODE_KINDS = {
    k.name: k
    for k in (
        NodeKind(
            "candidate",
            accepted=NodeStyle("accepted candidate", ACCEPTED, 16, "circle"),
            rejected=NodeStyle("rejected candidate", REJECTED, 11, "circle", 0.8),
        ),
        NodeKind("root", NodeStyle("root (base model's token)", ROOT, 16, "square"), place="root"),
        NodeKind("node", NodeStyle("node (head k, rank r)", NODE, 13, "circle"), token=False),
        NodeKind(
            "bonus",
            NodeStyle("bonus (base model's next token)", BONUS, 15, "diamond-open"),
            place="bonus token",
            in_column=False,
        ),
        NodeKind(
            "lookup",
            accepted=NodeStyle("lookup branch, accepted", ACCEPTED, 16, "triangle-right"),
            rejected=NodeStyle("lookup branch, rejected", LOOKUP, 11, "triangle-right-open", 0.8),
            head_depth=False,
            place="lookup branch (n-gram from the context), depth {depth}",
        ),
    )
}


def token_label(tokenizer, token_id: int) -> str:
    """A token as a short visible label: spaces, newlines and tabs made visible."""
    text = tokenizer.decode([int(token_id)], skip_special_tokens=False)
    text = text.replace(" ", "\u2423").replace("\n", "\u23ce").replace("\t", "\u21e5")
    return text if text.strip() else f"#{token_id}"


def tree_layout(parents: Sequence[int]) -> list[float]:
    """Vertical position of each node: leaves in depth-first order, a parent centred on its children."""
    children: list[list[int]] = [[] for _ in parents]
    for j, p in enumerate(parents):
        if p >= 0:
            children[p].append(j)
    y, leaves = [0.0] * len(parents), [0]

    def place(j: int) -> None:
        if not children[j]:
            y[j], leaves[0] = float(leaves[0]), leaves[0] + 1
            return
        for c in children[j]:
            place(c)
        y[j] = sum(y[c] for c in children[j]) / len(children[j])

    place(0)
    return y


def tree_nodes(view: StepView, tokenizer) -> list[dict]:
    """One dict per tree node of a Medusa step (depth, y, parent, token, head rank, accepted?, drafter),
    plus the bonus token (the base model's own next token after the accepted path) if it was kept."""
    step = view.step
    if step.tree is None:
        return []
    tree, ids, accepted = step.tree, step.tree_token_ids, set(step.accepted_nodes)
    y = tree_layout(tree.parents)
    # the lookup branch's nodes come last
    first_lookup = tree.num_nodes - tree.lookup

    def kind(j: int) -> str:
        return "root" if j == 0 else "lookup" if j >= first_lookup else "candidate"

    # who drafted the tree, and what its levels are (a Medusa tree's depth k is head k's)
    cls = REGISTRY.get(step.drafter or "")
    who = {"level": cls.levels if cls else "head", "drafted_by": cls.label if cls else ""}
    nodes = [
        {
            "node": j,
            "depth": int(tree.position_ids[j]),
            "y": y[j],
            "parent": tree.parents[j],
            "token_id": ids[j],
            "label": token_label(tokenizer, ids[j]),
            "rank": tree.choices[j - 1][-1] if 0 < j < first_lookup else None,
            "accepted": j in accepted,
            "kind": kind(j),
            "drafter": step.drafter,
            **who,
        }
        for j in range(tree.num_nodes)
    ]
    if len(step.tokens) > step.accept_length and step.accepted_nodes:
        last = step.accepted_nodes[-1]
        bonus = step.tokens[step.accept_length]
        nodes.append(
            {
                "node": tree.num_nodes,
                "depth": nodes[last]["depth"] + 0.5,
                "y": y[last],
                "parent": last,
                # between columns
                "token_id": bonus,
                "label": token_label(tokenizer, bonus),
                "rank": None,
                "accepted": True,
                "kind": "bonus",
                "drafter": step.drafter,
                **who,
            }
        )
    return nodes


def mask_data(view: StepView, tokenizer) -> tuple[list[list[int]], list[str], list[str]]:
    """The step's tree attention mask with the KV-cache prefix as one block column in front.

    z[i][j]: 0 = hidden, 1 = visible, 2 = visible and both nodes on the accepted path.
    Returns (z, column labels, row labels); labels are "node:token", unique per node."""
    step = view.step
    if step.tree is None:
        return [], [], []
    mask, ids, acc = step.tree.attn_mask.tolist(), step.tree_token_ids, set(step.accepted_nodes)
    labels = [f"{j}:{token_label(tokenizer, t)}" for j, t in enumerate(ids)]
    z = [
        [1] + [(2 if i in acc and j in acc else 1) if mask[i][j] else 0 for j in range(len(ids))]
        for i in range(len(ids))
    ]
    return z, [f"prefix ({view.prefix_len} tokens)"] + labels, labels


PATH_COLUMNS = ["step", "root token", "accepted tokens", "drafted by", "accept length", "tokens", "step (ms)"]


def path_rows(record: RunRecord, tokenizer) -> list[dict]:
    """The accepted-path table: one row per Medusa decode step."""
    rows = []
    for v in record.views[1:]:
        s = v.step
        ids = s.tree_token_ids
        rows.append(
            {
                "step": s.index,
                "root token": token_label(tokenizer, ids[0]) if ids else "",
                "accepted tokens": " ".join(token_label(tokenizer, t) for t in s.tokens[: s.accept_length]),
                "drafted by": ("lookup branch" if s.lookup_accepted else DRAFTER_NAMES.get(s.drafter or "", ""))
                if s.accept_length
                else "",
                "accept length": s.accept_length,
                "tokens": len(s.tokens),
                # the whole step: the static engine runs it as one program, with no verify time of its own
                "step (ms)": round(1000 * s.seconds, 1),
            }
        )
    return rows
