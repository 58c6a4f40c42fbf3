"""Medusa heads: K small ResBlock stacks on the base model's last hidden state.

Head k (1-based) reads h_t, the final-norm hidden state that ``lm_head`` reads, and predicts
token t+k+1 (Medusa paper, arXiv 2401.10774, eq. 1):

    p_t^(k) = softmax(W_2^(k) . ResBlock^L(h_t)),   ResBlock(x) = x + SiLU(W_1 x + b_1)

W_1 starts at zero, so a fresh head is the identity followed by the vocabulary projection.

The projection W_2 is either the head's own ``Linear(d, V)`` (paper, Medusa-1 checkpoints) or
the base model's shared ``lm_head`` (ResBlock-only heads, as in TGI's MedusaHeadV2): with a
shared projection the K heads cost one [K, d] x [d, V] matmul.

Root-conditioned heads (an option, ``root_conditioned``): every head also reads the token the
base model has just chosen after h_t (the tree's root, x_{t+1}), through its input embedding:

    ResBlock^L(h_t + R^(k) e(x_{t+1}))

R^(k) is a [d, d] matrix that starts at zero (so a fresh head is a plain Medusa head). The root
is known when the heads run (it is the base model's own pick at the last accepted node), so the
tree, its verification and the outputs are unchanged; only the proposals get better. This is the
first step of Hydra's sequentially dependent heads (arXiv 2402.05109), without their per-node cost.

Path-conditioned heads (``path_conditioned``, root-conditioned too) are Hydra's sequential heads:
head k also reads the tokens of its own branch above it, x_{t+2} .. x_{t+k}:

    ResBlock^L(h_t + R^(k) e(x_{t+1}) + sum_{j=1}^{k-1} P^(k,j) e(x_{t+j+1}))

P^(k,j) [d, d] start at zero (a fresh path head is a root-conditioned one). In a tree the
branch tokens are the node's ancestors, so proposals are made level by level (``draft``): one
batched head call per tree level, with one row per node that has children at that level.

Checkpoint files (every public format and ours) are found, read and written by ``heads_io.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

# Checkpoint files are read and written by heads_io.py; its public names are re-exported here.
from .heads_io import (
    CONFIG_FILE,
    HEADS_FILE,
    TREES_FILE,
    device_calibrations,
    save_heads,
)

# this module's error; it lives in messages.py so that vllm_format.py raises it too
from .messages import HeadsError
from .packing import PackedLinear, frozen_projection

__all__ = [
    "CONFIG_FILE",
    "HEADS_FILE",
    "TREES_FILE",
    "HeadsConfig",
    "HeadsError",
    "MedusaHeads",
    "ResBlock",
    "device_calibrations",
    "hidden_size_of",
    "save_heads",
]


class ResBlock(nn.Module):
    """x + SiLU(W x + b). W and b start at zero, so a fresh block is exactly the identity
    (the reference zeroes W only, leaving x + SiLU(b0) with a small random b0)."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.linear(x))


@dataclass(frozen=True)
class HeadsConfig:
    hidden_size: int
    # size of the base vocabulary the heads predict into
    vocab_size: int
    num_heads: int = 4
    num_layers: int = 1
    # project with the base lm_head (ResBlock-only heads)
    shared_lm_head: bool = True
    # own projection onto this many frequent tokens (None = full vocab)
    num_proposal_tokens: int | None = None
    base_model: str | None = None
    # heads also read the root token's input embedding (see module doc)
    root_conditioned: bool = False
    # Head k also reads its branch tokens x_{t+2}..x_{t+k} (Hydra; needs root_conditioned).
    path_conditioned: bool = False


class MedusaHeads(nn.Module):
    """K heads. ``self.heads[i]`` is ``Sequential(ResBlock * L [, Linear(d, V')])``, the reference layout."""

    def __init__(self, config: HeadsConfig):
        super().__init__()
        self.config = config
        d = config.hidden_size
        own = not config.shared_lm_head
        out = config.num_proposal_tokens or config.vocab_size
        # L independent blocks per head (never [ResBlock(d)] * L, which shares one block).
        self.heads = nn.ModuleList(
            nn.Sequential(
                *[ResBlock(d) for _ in range(config.num_layers)], *([nn.Linear(d, out, bias=False)] if own else [])
            )
            for _ in range(config.num_heads)
        )
        # R^(k) of root-conditioned heads: zero at start, so they begin as plain Medusa heads.
        self.root = (
            nn.ModuleList(nn.Linear(d, d, bias=False) for _ in range(config.num_heads))
            if config.root_conditioned
            else None
        )
        if config.path_conditioned and not config.root_conditioned:
            raise HeadsError("Path-conditioned heads read the root token too; set root_conditioned=True as well.")
        # P^(k,j) of path-conditioned heads: head i (0-based) reads the i branch tokens above it.
        self.path = (
            nn.ModuleList(nn.ModuleList(nn.Linear(d, d, bias=False) for _ in range(i)) for i in range(config.num_heads))
            if config.path_conditioned
            else None
        )
        for m in [*(self.root or []), *(p for ps in (self.path or []) for p in ps)]:
            nn.init.zeros_(m.weight)
        # trees calibrated for these heads (trees.json)
        self.tree_presets: dict[str, list[list[int]]] = {}
        # the preset to use when none is chosen
        self.default_tree: str | None = None
        # Lookup-branch length the default tree was calibrated with (None: not calibrated).
        self.lookup: int | None = None
        # config.json's calibration record (measured figures the page quotes)
        self.calibration: dict | None = None
        # Device kind ("cuda", ...) -> a calibration made on another kind of device than the one above.
        self.calibrations: dict[str, dict] = {}
        # Token id of each output column when the heads predict into a pruned vocabulary.
        if config.num_proposal_tokens:
            self.register_buffer("proposal_ids", torch.arange(config.num_proposal_tokens), persistent=True)
        else:
            self.proposal_ids = None

    @property
    def num_heads(self) -> int:
        return self.config.num_heads

    def init_from_lm_head(self, lm_head: nn.Module) -> None:
        """Own projections start as copies of the base lm_head (paper), restricted to proposal_ids."""
        if self.config.shared_lm_head:
            return
        w = lm_head.weight.detach()
        if self.proposal_ids is not None:
            w = w[self.proposal_ids.to(w.device)]
        for head in self.heads:
            head[-1].weight.data.copy_(w.to(head[-1].weight.dtype))

    @property
    def root_conditioned(self) -> bool:
        return self.root is not None

    @property
    def path_conditioned(self) -> bool:
        return self.path is not None

    def root_embedding(self, embed: nn.Module, root: torch.Tensor) -> torch.Tensor | None:
        """What ``root_emb`` must be for root tokens ``root`` [...]: rows of the base model's input
        embedding matrix (``model.get_input_embeddings()``), or None for plain heads. The raw rows,
        not ``embed(root)``: training reads the same rows, whatever scaling a model's embedding
        module applies in its forward."""
        if self.root is None:
            return None
        w = embed.weight
        return w[root.to(w.device)]

    def hidden(
        self,
        h: torch.Tensor,
        num_heads: int | None = None,
        root_emb: torch.Tensor | None = None,
        path_emb: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """ResBlock outputs [..., K, d] for the first ``num_heads`` heads.

        ``root_emb`` [..., d]: the input embedding of the root token after each h, required by
        root-conditioned heads (ignored by plain ones). ``path_emb`` [..., K-1, d]: the embeddings
        of x_{t+2}..x_{t+K} (teacher forcing: the true branch), required by path-conditioned heads
        from the second head on.
        """
        n = self.num_heads if num_heads is None else num_heads
        if self.root is not None and root_emb is None:
            raise HeadsError("These heads are root-conditioned; pass the root token's embedding as root_emb.")
        if self.path is not None and n > 1 and (path_emb is None or path_emb.shape[-2] < n - 1):
            raise HeadsError(
                f"These heads are path-conditioned; pass the embeddings of the {n - 1} branch tokens after the root "
                f"as path_emb [..., {n - 1}, d]."
            )
        return torch.stack([self._head(i, h, root_emb, path_emb) for i in range(n)], dim=-2)

    def _head(
        self, i: int, h: torch.Tensor, root_emb: torch.Tensor | None, path_emb: torch.Tensor | None
    ) -> torch.Tensor:
        """ResBlock output of head i (0-based) at h [..., d]; path_emb [..., >= i, d] its branch tokens."""
        # Indexing, not slicing: a slice of a ModuleList / Sequential builds a new module on every call.
        x, head = h, self.heads[i]
        if self.root is not None:
            x = x + self.root[i](root_emb.to(device=x.device, dtype=x.dtype))
        if self.path is not None:
            for j in range(i):
                x = x + self.path[i][j](path_emb[..., j, :].to(device=x.device, dtype=x.dtype))
        for j in range(self.config.num_layers):
            x = head[j](x)
        return x

    def forward(
        self,
        h: torch.Tensor,
        lm_head: nn.Module | None = None,
        num_heads: int | None = None,
        root_emb: torch.Tensor | None = None,
        path_emb: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Head logits [..., K, V'] from final hidden states [..., d].

        V' is the full vocabulary, or ``num_proposal_tokens`` columns (token ids in ``proposal_ids``).
        """
        z = self.hidden(h, num_heads, root_emb, path_emb)
        if self.config.shared_lm_head:
            return self._project(z, lm_head)
        return torch.stack([self._project(z[..., i, :], lm_head, i) for i in range(z.shape[-2])], dim=-2)

    def _project(self, z: torch.Tensor, lm_head: nn.Module | None, i: int | None = None) -> torch.Tensor:
        """Logits of ResBlock outputs z: through the shared lm_head (rows of the proposal tokens),
        or head i's own projection."""
        if not self.config.shared_lm_head:
            return self.heads[i][-1](z)
        if lm_head is None:
            raise HeadsError("These heads share the base model's lm_head; pass it as lm_head=model.lm_head.")
        if self.proposal_ids is not None:
            return self.proposal_projection(lm_head)(z)
        return lm_head(z.to(lm_head.weight.dtype))

    def proposal_projection(self, lm_head: nn.Module) -> nn.Module:
        """A frozen map onto the lm_head rows of the proposal tokens, gathered once (pre-packed when the
        model is); built before a traced step reads it."""
        if torch.compiler.is_compiling():
            return self._proposal_proj
        w = lm_head.weight
        # set by load_heads: int8 drafts (packing.int8_fits)
        int8 = getattr(self, "int8", False)
        key = (w.data_ptr(), w._version, w.dtype, w.device, self.proposal_ids.data_ptr(), int8)
        if getattr(self, "_proposal_key", None) != key:
            rows = w[self.proposal_ids.to(w.device)].detach()
            # Packed like the model (torch.compile cannot lower packed weights); not a submodule: no state_dict entry.
            proj = frozen_projection(rows, packed=isinstance(lm_head, PackedLinear), int8=int8)
            object.__setattr__(self, "_proposal_proj", proj)
            self._proposal_key = key
        return self._proposal_proj

    @torch.no_grad()
    def propose(
        self,
        h: torch.Tensor,
        lm_head: nn.Module | None,
        *,
        topk: int,
        num_heads: int | None = None,
        root_emb: torch.Tensor | None = None,
        path_emb: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Top-k token ids [..., K, topk] of each head at hidden states h [..., d] (no softmax needed)."""
        logits = self.forward(h, lm_head, num_heads, root_emb, path_emb)
        return self._token_ids(torch.topk(logits, topk, dim=-1).indices)

    def _token_ids(self, columns: torch.Tensor) -> torch.Tensor:
        return columns if self.proposal_ids is None else self.proposal_ids[columns]

    @torch.no_grad()
    def draft(
        self, h: torch.Tensor, lm_head: nn.Module | None, tree, root: torch.Tensor, embed: nn.Module | None = None
    ) -> torch.Tensor:
        """Token ids [..., L] of every node of ``tree`` (a ``MedusaTree``) after hidden states h [..., d]
        whose roots are ``root`` [...] (one tree per hidden state; decoding drafts one).

        Plain and root-conditioned heads: one call of the heads, then [root, head-1 top-k,
        head-2 top-k, ...][tree_indices] (the reference). Path-conditioned heads: level by level,
        head k at the nodes of depth k - 1 that have children, reading the tokens of their branch.
        ``embed`` is ``model.get_input_embeddings()`` (needed by root- and path-conditioned heads).
        """
        root = root.to(h.device).reshape(h.shape[:-1] + (1,))
        if self.path is None:
            proposals = self.propose(
                h, lm_head, topk=tree.topk, num_heads=tree.depth, root_emb=self.root_embedding(embed, root[..., 0])
            )
            return torch.cat([root, proposals.flatten(-2).to(root.device)], dim=-1)[
                ..., tree.tree_indices.to(root.device)
            ]
        w = embed.weight
        tokens = torch.empty(h.shape[:-1] + (tree.num_nodes,), dtype=torch.long, device=h.device)
        tokens[..., 0] = root[..., 0]
        root_emb = w[root.to(w.device)]  # [..., 1, d]
        # head k (0-based) proposes the nodes of depth k + 1
        for k, level in enumerate(tree.levels):
            m = level.ancestors.shape[0]
            # [..., m, k, d]: the branch above each parent
            path_emb = w[tokens[..., level.ancestors.to(h.device)].to(w.device)]
            z = self._head(
                k,
                h.unsqueeze(-2).expand(*h.shape[:-1], m, h.shape[-1]),
                root_emb.expand(*h.shape[:-1], m, h.shape[-1]),
                path_emb,
            )
            top = torch.topk(self._project(z, lm_head, k), level.topk, dim=-1).indices  # [..., m, topk]
            tokens[..., level.nodes.to(h.device)] = self._token_ids(
                top[..., level.rows.to(top.device), level.ranks.to(top.device)]
            ).to(h.device)
        return tokens

    def check_fits(self, model: nn.Module) -> None:
        """Refuse heads whose hidden size or vocabulary does not match the base model."""
        self.check_sizes(hidden_size_of(model.config), model.get_output_embeddings().weight.shape[0])
        emb = model.get_input_embeddings().weight.shape[1]
        if self.root is not None and emb != self.config.hidden_size:
            raise HeadsError(
                f"These {'path' if self.path is not None else 'root'}-conditioned Medusa heads read token embeddings "
                f"of width {self.config.hidden_size}, but the model's "
                f"input embeddings have width {emb}; use plain Medusa heads with this model."
            )

    def check_sizes(self, d: int, V: int) -> None:
        """Refuse heads made for another hidden size ``d`` or vocabulary ``V`` (a model's, or its config's before it
        loads)."""
        if self.config.hidden_size != d:
            raise HeadsError(
                f"These Medusa heads were made for hidden size {self.config.hidden_size}, "
                f"but the model has hidden size {d}; "
                f"load heads trained for this model{f' ({self.config.base_model})' if self.config.base_model else ''}."
            )
        if self.config.vocab_size != V:
            raise HeadsError(
                f"These Medusa heads predict a vocabulary of {self.config.vocab_size} tokens, but the model's has {V}; "
                "load heads trained for this model and tokenizer."
            )

    # ---------------------------------------------------------------- saving
    def save(
        self, folder: str | Path, *, base_model: str | None = None, dtype: torch.dtype | None = None, **extra
    ) -> Path:
        """Save as ``medusa_lm_head.safetensors`` + ``config.json`` (read back by :func:`load_heads`);
        ``dtype`` stores the weights in another float type (e.g. bfloat16, half the size)."""
        return save_heads(self, folder, base_model=base_model, dtype=dtype, **extra)


def hidden_size_of(config) -> int:
    """The hidden size of a transformers config, whatever the family calls it."""
    for name in ("hidden_size", "n_embd", "d_model"):
        if getattr(config, name, None):
            return int(getattr(config, name))
    raise HeadsError("Cannot tell the model's hidden size from its config.")
