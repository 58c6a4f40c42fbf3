"""Our EAGLE drafter (``EagleRun.extend`` / ``draft``) checked against the reference's tree drafting.

``ReferenceModel.topK_genrate`` below is a port of ``Model.topK_genrate`` from SafeAILab/EAGLE
(https://github.com/SafeAILab/EAGLE, Apache-2.0, commit cb7e0841fe0c206c6ed74a197ad5e2a1f13f5a2b),
``eagle/model/cnets1.py`` L673-822 (EAGLE-1/2); EAGLE-3's ``eagle/model/cnets.py`` L670-827 is the same
loop, drawing through its own lm_head and mapping draft-vocabulary indices to token ids with ``d2t``
(L711-713, L753-755). Variable names, the order of operations and the bookkeeping (position ids, tree
mask, KV cache, parents, selection, retrieve indices) are the reference's; line numbers cite cnets1.py.
Only the draft model's layer is ours: ``Model.forward``'s embed + fc + decoder layer (L588-659) is
``EagleHead.forward`` on a tiny random llama, and ``head`` is the base lm_head (or its proposal rows), so
both drafters see the same draft distributions and any difference is in the drafting itself.

What the reference gives the draft layer at depth >= 2 (forward i = 1 .. depth - 1 of its loop):
- positions: every one of the k frontier nodes at ``len_posi + i`` (L719), len_posi = number of
  verified pairs (f_t, x_{t+1}) in stable_kv, i.e. the position of the level-1 token's pair;
- mask: all of stable_kv, and of the k * (i + 1) drafted entries exactly the node's own ancestors and
  itself (L718, L751, L560-566: the tree mask overrides the causal block);
- cache: stable_kv (verified pairs only, L693-699) + every drafted entry of every earlier level, all k
  per level, chosen or not (the tree mask hides the others); drafted entries never enter stable_kv.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import pytest
import torch
from conftest import VOCAB, make_model
from torch import nn
from transformers import DynamicCache

import medusa_lib.core.eagle_run as eagle_module
from medusa_lib.core.dynamic_tree import DEPTH_PENALTY, DynamicTreeConfig
from medusa_lib.core.eagle import new_eagle_head
from medusa_lib.core.eagle_run import EagleRun

PROMPT_LEN = 12
LM_HEAD_SCALE = 15.0  # peaky random draft distributions, so the selected trees reach depth >= 3
SETTINGS = [  # (top_k, depth, num_nodes) in our convention: depth = levels below the root
    (1, 4, 4),
    (2, 3, 5),
    (3, 4, 12),
    (4, 5, 20),
    (8, 5, 40),
]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny tensors: one intra-op thread is faster (and spins no idle thread on a busy machine)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# ------------------------------------------------------------------ the reference, ported
def _make_causal_mask(input_ids_shape, dtype, device, past_key_values_length=0):  # cnets1.py L48-63
    bsz, tgt_len = input_ids_shape
    mask = torch.full((tgt_len, tgt_len), torch.finfo(dtype).min, device=device)
    mask_cond = torch.arange(mask.size(-1), device=device)
    mask.masked_fill_(mask_cond < (mask_cond + 1).view(mask.size(-1), 1), 0)
    mask = mask.to(dtype)
    if past_key_values_length > 0:
        mask = torch.cat([torch.zeros(tgt_len, past_key_values_length, dtype=dtype, device=device), mask], dim=-1)
    return mask[None, None, :, :].expand(bsz, 1, tgt_len, tgt_len + past_key_values_length)


def _expand_mask(mask, dtype, tgt_len=None):  # cnets1.py L66-77
    bsz, src_len = mask.size()
    tgt_len = tgt_len if tgt_len is not None else src_len
    expanded_mask = mask[:, None, None, :].expand(bsz, 1, tgt_len, src_len).to(dtype)
    inverted_mask = 1.0 - expanded_mask
    return inverted_mask.masked_fill(inverted_mask.to(torch.bool), torch.finfo(dtype).min)


class ReferenceModel:
    """cnets1.py ``Model`` (L472-822), reduced to what ``topK_genrate`` reads; its layer is our EagleHead."""

    def __init__(self, eagle, *, total_tokens, depth, top_k, d2t=None):
        self.eagle = eagle
        self.device = eagle.fc.weight.device  # the reference's self.embed_tokens.weight.device
        self.top_k = top_k
        self.total_tokens = total_tokens - 1  # L516
        self.depth = depth
        self.d2t = d2t  # EAGLE-3 (cnets.py L538-540); None: draft vocabulary == target vocabulary
        self.logsoftmax = nn.LogSoftmax(dim=-1)
        self.init_tree()
        self.reset_kv()

    def init_tree(self):  # L530-533
        self.tree_mask_init = torch.eye(self.top_k, device=self.device)[None, None]
        self.position_ids = torch.zeros(self.top_k, device=self.device, dtype=torch.long)

    def reset(self):  # L535-536
        self.tree_mask = None

    def reset_kv(self):  # L669-670
        self.stable_kv = None

    def _prepare_decoder_attention_mask(self, attention_mask, input_shape, inputs_embeds, past_key_values_length):
        # L538-568: causal mask over [past | new], then the tree mask overrides the last block
        combined_attention_mask = None
        if input_shape[-1] > 1:
            combined_attention_mask = _make_causal_mask(
                input_shape, torch.float32, device=inputs_embeds.device, past_key_values_length=past_key_values_length
            )
        if attention_mask is not None:
            expanded_attn_mask = _expand_mask(attention_mask, torch.float32, tgt_len=input_shape[-1]).to(
                inputs_embeds.device
            )
            combined_attention_mask = (
                expanded_attn_mask if combined_attention_mask is None else expanded_attn_mask + combined_attention_mask
            )
        # [MODIFIED] add tree mask
        if hasattr(self, "tree_mask") and self.tree_mask is not None:
            tree_mask = self.tree_mask
            _, _, tree_shape0, tree_shape1 = tree_mask.shape
            combined_attention_mask[:, :, -tree_shape0:, -tree_shape1:][tree_mask == 0] = torch.finfo(torch.float32).min
        return combined_attention_mask

    def __call__(self, hidden_states, input_ids, past_key_values=None, position_ids=None, use_cache=True):
        """``Model.forward`` L570-667 at inference; embed + fc + layer (L588-659) are ``EagleHead.forward``.
        ``past_key_values`` is the reference's tuple ((k, v),): a forward returns a new one and never
        changes the one it was given (its attention concatenates, L289-292), so stable_kv stays verified."""
        batch_size, seq_length, _ = hidden_states.shape
        seq_length_with_past = seq_length
        past_key_values_length = 0
        if past_key_values is not None:
            past_key_values_length = past_key_values[0][0].shape[2]
            seq_length_with_past = seq_length_with_past + past_key_values_length
        if position_ids is None:
            position_ids = torch.arange(
                past_key_values_length, seq_length + past_key_values_length, dtype=torch.long, device=self.device
            )
            position_ids = position_ids.unsqueeze(0).view(-1, seq_length)
        else:
            position_ids = position_ids.view(-1, seq_length).long()
        attention_mask = torch.ones((batch_size, seq_length_with_past), dtype=torch.bool, device=self.device)
        attention_mask = self._prepare_decoder_attention_mask(
            attention_mask, (batch_size, seq_length), hidden_states, past_key_values_length
        )
        cache = DynamicCache(ddp_cache_data=past_key_values) if past_key_values is not None else DynamicCache()
        hidden_states = self.eagle(hidden_states, input_ids, position_ids, attention_mask=attention_mask, cache=cache)
        next_decoder_cache = tuple((layer.keys, layer.values) for layer in cache.layers)
        return hidden_states, next_decoder_cache

    @torch.no_grad()
    def topK_genrate(self, hidden_states, input_ids, head, logits_processor):  # L673-822
        input_ids = input_ids.to(hidden_states.device)
        total_tokens = self.total_tokens
        depth = self.depth
        top_k = self.top_k
        sample_token = input_ids[:, -1]
        scores_list = []
        parents_list = []
        ss_token = []
        input_ids = input_ids[:, 1:]
        input_ids = input_ids.to(hidden_states.device)
        len_posi = input_ids.shape[1]
        self.reset()
        # L692-700: the verified pairs extend stable_kv (positions kv_len .. len_posi - 1, causal mask)
        if hasattr(self, "stable_kv") and self.stable_kv is not None:
            kv_len = self.stable_kv[0][0].shape[2]
            out_hidden, past_key_values = self(
                hidden_states, input_ids=input_ids[:, kv_len:], past_key_values=self.stable_kv, use_cache=True
            )
        else:
            out_hidden, past_key_values = self(hidden_states, input_ids=input_ids, use_cache=True)
        self.stable_kv = past_key_values
        last_hidden = out_hidden[:, -1]
        # L702-714: level 1 is the top-k after the newest verified entry
        last_headout = head(last_hidden)
        logits = [last_headout]  # test only
        last_p = self.logsoftmax(last_headout)
        top = torch.topk(last_p, top_k, dim=-1)
        topk_index, topk_p = top.indices, top.values
        scores = topk_p[0]
        scores_list.append(scores[None])
        parents_list.append(torch.zeros(1, dtype=torch.long, device=scores.device))
        if self.d2t is None:
            ss_token.append(topk_index)
            input_ids = topk_index
        else:  # cnets.py L711-713
            ss_token.append(topk_index + self.d2t[topk_index])
            input_ids = topk_index + self.d2t[topk_index]
        input_hidden = last_hidden[None].repeat(1, top_k, 1)
        tree_mask = self.tree_mask_init
        topk_cs_index = torch.arange(top_k, device=self.device)
        # 4
        for i in range(depth):  # L717-751: one draft forward of the k frontier nodes per level
            self.tree_mask = tree_mask
            position_ids = len_posi + self.position_ids
            out_hidden, past_key_values = self(
                input_hidden,
                input_ids=input_ids,
                past_key_values=past_key_values,
                position_ids=position_ids,
                use_cache=True,
            )
            len_posi += 1
            # parents are 1-based candidate indices (0: the root): the frontier's place in scores_list + 1
            bias1 = top_k if i > 0 else 0
            bias2 = max(0, i - 1)
            bias = 1 + top_k**2 * bias2 + bias1
            parents = topk_cs_index + bias
            parents_list.append(parents)
            last_headout = head(out_hidden[0])
            logits.append(last_headout)  # test only
            last_p = self.logsoftmax(last_headout)
            top = torch.topk(last_p, top_k, dim=-1)
            topk_index, topk_p = top.indices, top.values
            cu_scores = topk_p + scores[:, None]
            topk_cs = torch.topk(cu_scores.view(-1), top_k, dim=-1)
            topk_cs_index, topk_cs_p = topk_cs.indices, topk_cs.values
            scores = topk_cs_p
            out_ids = topk_cs_index // top_k
            input_hidden = out_hidden[:, out_ids]
            input_ids = topk_index.view(-1)[topk_cs_index][None]
            if self.d2t is None:
                ss_token.append(topk_index)
            else:  # cnets.py L753-755
                input_ids = input_ids + self.d2t[input_ids]
                ss_token.append(topk_index + self.d2t[topk_index])
            scores_list.append(cu_scores)
            tree_mask = torch.cat((tree_mask[:, :, out_ids], self.tree_mask_init), dim=3)
        # L755-768: the best total_tokens candidates, in candidate order; each one's parent's tree index
        scores_list = torch.cat(scores_list, dim=0).view(-1)
        ss_token_list = torch.cat(ss_token, dim=0).view(-1)
        top_scores = torch.topk(scores_list, total_tokens, dim=-1)
        top_scores_index = top_scores.indices
        top_scores_index = torch.sort(top_scores_index).values
        draft_tokens = ss_token_list[top_scores_index]
        draft_tokens = torch.cat((sample_token, draft_tokens), dim=0)
        draft_parents = torch.cat(parents_list, dim=0)[top_scores_index // top_k].long()
        mask_index = torch.searchsorted(top_scores_index, draft_parents - 1, right=False)
        mask_index[draft_parents == 0] = -1
        mask_index = mask_index + 1
        mask_index_list = mask_index.tolist()
        # L771-777: each node sees the root, its ancestors and itself; its position is its depth
        tree_mask = torch.eye(total_tokens + 1).bool()
        tree_mask[:, 0] = True
        for i in range(total_tokens):
            tree_mask[i + 1].add_(tree_mask[mask_index_list[i]])
        tree_position_ids = torch.sum(tree_mask, dim=1) - 1
        tree_mask = tree_mask.float()[None, None]
        draft_tokens = draft_tokens[None]
        # test only: what the comparison reads
        self.trace = Trace(
            scores_list, ss_token_list, torch.cat(parents_list)[torch.arange(len(scores_list)) // top_k] - 1,
            mask_index, logits, past_key_values,
        )  # fmt: skip
        # L786-818: one row per leaf, the path from the root, -1 padded to the deepest leaf
        max_depth = torch.max(tree_position_ids) + 1
        noleaf_index = torch.unique(mask_index).tolist()
        noleaf_num = len(noleaf_index) - 1
        leaf_num = total_tokens - noleaf_num
        retrieve_indices = torch.zeros(leaf_num, max_depth.item(), dtype=torch.long) - 1
        retrieve_indices = retrieve_indices.tolist()
        rid = 0
        position_ids_list = tree_position_ids.tolist()
        for i in range(total_tokens + 1):
            if i not in noleaf_index:
                cid = i
                depth = position_ids_list[i]
                for j in reversed(range(depth + 1)):
                    retrieve_indices[rid][j] = cid
                    cid = mask_index_list[cid - 1]
                rid += 1
        if logits_processor is not None:  # sampling sorts the rows (L806-816); greedy keeps leaf order
            maxitem = total_tokens + 5

            def custom_sort(lst):
                return [lst[i] if lst[i] >= 0 else maxitem for i in range(len(lst))]

            retrieve_indices = sorted(retrieve_indices, key=custom_sort)
        retrieve_indices = torch.tensor(retrieve_indices, dtype=torch.long)
        tree_position_ids = tree_position_ids.to(hidden_states.device)
        return draft_tokens, retrieve_indices, tree_mask, tree_position_ids


class Trace(NamedTuple):
    """What the reference drafted inside ``topK_genrate`` (kept for the comparison only)."""

    scores: torch.Tensor  # [C] cumulative log q of every candidate (scores_list)
    tokens: torch.Tensor  # [C] ss_token_list
    parents: torch.Tensor  # [C] 0-based candidate index of each one's parent, -1: the root (ours)
    mask_index: torch.Tensor  # [total_tokens] tree index of each kept node's parent
    logits: list  # [1, V'] then [k, V'] per draft forward: head(out_hidden)
    past_key_values: tuple  # ((k, v),) after the last draft forward: stable_kv + every drafted entry


# ------------------------------------------------------------------ what both drafters were given
class Call(NamedTuple):
    position_ids: torch.Tensor  # [q]
    visible: torch.Tensor  # [q, past + q] True where the query attends (additive mask == 0)
    past: int  # cache entries before the call
    out: torch.Tensor  # [q, d] what the layer computed


def record_forwards(head, monkeypatch) -> list[Call]:
    """Every EagleHead forward (ours and the port's) appends what it was given and what it computed."""
    calls, forward = [], head.forward

    def recorded(features, tokens, position_ids, *, attention_mask=None, cache=None):
        past = cache.get_seq_length() if cache is not None else 0
        g = forward(features, tokens, position_ids, attention_mask=attention_mask, cache=cache)
        visible = (attention_mask == 0)[0, 0].clone()
        calls.append(Call(position_ids.reshape(-1).clone(), visible, past, g[0].detach().clone()))
        return g

    monkeypatch.setattr(head, "forward", recorded)
    return calls


class Setup(NamedTuple):
    model: nn.Module
    head: nn.Module
    prompt: list[int]
    lm_head: nn.Module  # the reference's ``head``: the base lm_head, or its proposal rows (EAGLE-3's draft lm_head)
    d2t: torch.Tensor | None


@functools.cache  # one model and head per (seed, vocab), shared by the settings: the tests only read them
def setup(seed: int, vocab: str) -> Setup:
    model = make_model("llama", seed=seed)
    with torch.no_grad():
        model.lm_head.weight.mul_(LM_HEAD_SCALE)
    g = torch.Generator().manual_seed(seed)
    proposal_ids = torch.randperm(VOCAB, generator=g)[:200].sort().values if vocab == "proposal" else None
    torch.manual_seed(100 + seed)
    head = new_eagle_head(model, proposal_ids=proposal_ids).eval().requires_grad_(False)
    lm_head, d2t = model.lm_head, None
    if proposal_ids is not None:  # EAGLE-3: its own lm_head over the draft vocabulary, token = index + d2t[index]
        lm_head = nn.Linear(model.config.hidden_size, len(proposal_ids), bias=False)
        lm_head.weight = nn.Parameter(model.lm_head.weight[proposal_ids].clone(), requires_grad=False)
        d2t = proposal_ids - torch.arange(len(proposal_ids))
    prompt = [1] + torch.randint(3, VOCAB, (PROMPT_LEN - 1,), generator=g).tolist()
    return Setup(model, head, prompt, lm_head, d2t)


@torch.no_grad()
def features_of(model, ids: list[int]) -> torch.Tensor:
    """f_t for every position: the base model's final-norm hidden states, what its lm_head reads."""
    return model.model(input_ids=torch.tensor([ids])).last_hidden_state[0]


# ------------------------------------------------------------------ the comparison
def assert_same_draft(ours, ref, ref_out, *, cfg: DynamicTreeConfig, step: int):
    k, where = cfg.top_k, f"step {step}"
    calls, cand, tree, logits, cache = ours
    ref_calls, trace = ref
    draft_tokens, retrieve_indices, tree_mask, tree_position_ids = ref_out

    # what the layer was given and computed: 1 forward of the verified pairs, then depth - 1 draft forwards
    assert len(calls) == len(ref_calls) == cfg.depth, where
    for level, (a, b) in enumerate(zip(calls, ref_calls)):  # level 0: extend; level >= 1 drafts level + 1
        at = f"{where}, forward {level}"
        assert a.past == b.past, f"{at}: cache length {a.past} != reference {b.past}"
        assert torch.equal(a.position_ids, b.position_ids), f"{at}: positions {a.position_ids} != {b.position_ids}"
        assert torch.equal(a.visible, b.visible), f"{at}: attention mask differs from the reference's"
        torch.testing.assert_close(a.out, b.out, rtol=1e-5, atol=1e-5, msg=lambda m: f"{at}: layer output: {m}")

    # the draft logits of every level: level 1 from the newest verified entry, levels >= 2 from the draft forwards
    assert len(logits) == len(trace.logits) == cfg.depth, where
    for level, (a, b) in enumerate(zip(logits, trace.logits), start=1):
        torch.testing.assert_close(
            a.reshape(b.shape).float(), b.float(), rtol=1e-5, atol=1e-5, msg=lambda m: f"{where}, level {level}: {m}"
        )

    # every drafted candidate, level by level (level 1: k; deeper: k*k, frontier row-major, child rank)
    # Parents: the reference stores 1-based candidate indices with 0 for the root (it searches
    # ``draft_parents - 1``); ours are 0-based with -1 for the root. Trace.parents is shifted to ours.
    bounds = [0, k] + [k + j * k * k for j in range(1, cfg.depth)]
    for level, (lo, hi) in enumerate(zip(bounds, bounds[1:]), start=1):
        at = f"{where}, level {level}"
        assert torch.equal(cand.tokens[lo:hi], trace.tokens[lo:hi]), f"{at}: candidate tokens differ"
        assert torch.equal(cand.parents[lo:hi], trace.parents[lo:hi]), f"{at}: candidate parents differ"
        torch.testing.assert_close(cand.scores[lo:hi], trace.scores[lo:hi], rtol=1e-5, atol=1e-5)

    # Selection: the reference keeps topk(scores); ours topk(scores - DEPTH_PENALTY * depth), so that a
    # child whose log q is exactly 0 never outranks its parent (the reference could then keep an orphan).
    # The two keep the same set unless two candidates of different depths lie within DEPTH_PENALTY * depth
    # of each other across the cut: make sure this data has no such near tie, so the comparison is exact.
    if cfg.num_nodes < len(trace.scores):
        s = trace.scores.sort(descending=True).values
        gap = float(s[cfg.num_nodes - 1] - s[cfg.num_nodes])
        assert gap > DEPTH_PENALTY * cfg.depth, f"{where}: a near tie at the cut ({gap:.2e}); pick another seed"

    # the selected tree: tokens (root first), parents, tree attention mask, positions (depths)
    assert torch.equal(tree.tokens, draft_tokens[0]), f"{where}: tree tokens {tree.tokens} != {draft_tokens[0]}"
    assert torch.equal(tree.parents[1:], trace.mask_index), f"{where}: tree parents differ"
    assert torch.equal(tree.attn_mask, tree_mask[0, 0].long()), f"{where}: tree attention mask differs"
    assert torch.equal(tree.position_ids, tree_position_ids), f"{where}: tree position ids differ"

    # Retrieve indices, a convention difference: the reference has one row per *leaf* (leaves in tree
    # order when greedy; sorted when sampling), as wide as the deepest leaf; ours has one row per node
    # (every node's path from the root, a fixed [L, depth + 1] shape). Our leaves' rows, cut to the
    # reference's width, must be the reference's rows in the same order.
    L = cfg.num_nodes + 1
    is_leaf = torch.ones(L, dtype=torch.bool)
    is_leaf[tree.parents[1:]] = False
    width = retrieve_indices.shape[1]
    leaf_rows = tree.retrieve_indices[is_leaf]
    assert (leaf_rows[:, width:] == -1).all(), where
    assert torch.equal(leaf_rows[:, :width], retrieve_indices), f"{where}: root-to-leaf paths differ"

    # the drafter's cache after drafting: verified entries, then all k drafted entries of every level
    (ref_k, ref_v), (our_k, our_v) = trace.past_key_values[0], cache
    torch.testing.assert_close(our_k, ref_k, rtol=1e-5, atol=1e-5, msg=lambda m: f"{where}: cache keys: {m}")
    torch.testing.assert_close(our_v, ref_v, rtol=1e-5, atol=1e-5, msg=lambda m: f"{where}: cache values: {m}")


def accept_deepest(s: Setup, ids: list[int], tree) -> tuple[tuple, int, list[int]]:
    """The next step's verified pairs, root and sequence when the base model accepts (up to) two nodes
    of the tree's deepest path and adds its own next token (the new root)."""
    path = [int(j) for j in tree.retrieve_indices[int(tree.position_ids.argmax())] if j > 0][:2]
    accepted = tree.tokens[path].tolist()
    features = features_of(s.model, ids + accepted)
    start = len(ids) - 1  # the old root's pair (f_root, x_next) comes first
    root = int(s.model.lm_head(features[-1]).argmax())
    ids = ids + accepted + [root]
    return (features[start:], torch.tensor(ids[start + 1 :]), start), root, ids


@pytest.mark.parametrize("seed, vocab", [(0, "full"), (1, "full"), (2, "proposal")])  # proposal: EAGLE-3's d2t
@pytest.mark.parametrize("top_k, depth, num_nodes", SETTINGS)
@torch.no_grad()
def test_eagle_run_drafts_what_the_reference_topK_genrate_drafts(top_k, depth, num_nodes, seed, vocab, monkeypatch):
    """Two decoding steps (prefill, then one accepted path) drafted by EagleRun and by the port, on one head."""
    cfg = DynamicTreeConfig(top_k=top_k, depth=depth, num_nodes=num_nodes)
    s = setup(seed, vocab)
    calls = record_forwards(s.head, monkeypatch)
    our_logits, cands = [], []
    logits, select_tree = s.head.logits, eagle_module.select_tree
    monkeypatch.setattr(s.head, "logits", lambda g: our_logits.append(logits(g)) or our_logits[-1])
    keep = lambda root, cand, **kw: cands.append(cand) or select_tree(root, cand, **kw)
    monkeypatch.setattr(eagle_module, "select_tree", keep)
    run = EagleRun(s.head, cfg)
    ref = ReferenceModel(s.head, total_tokens=num_nodes + 1, depth=depth - 1, top_k=top_k, d2t=s.d2t)

    # step 1 (prefill): pairs (f_t, x_{t+1}) for t = 0 .. n-1, the last token being the root x_n
    features = features_of(s.model, s.prompt)
    root = int(s.model.lm_head(features[-1]).argmax())
    ids = s.prompt + [root]
    pairs = (features, torch.tensor(ids[1:]), 0)
    deepest = []
    for step in (1, 2):
        our_logits.clear(), cands.clear(), calls.clear()
        run.extend(*pairs)  # step 2: drops step 1's drafted entries first
        tree = run.draft(torch.tensor(root))
        ours = (list(calls), cands[0], tree, list(our_logits), (run.cache.layers[0].keys, run.cache.layers[0].values))
        calls.clear()
        ref_out = ref.topK_genrate(pairs[0][None], torch.tensor([ids]), s.lm_head, None)
        assert ref.stable_kv[0][0].shape[2] == run.stable == len(ids) - 1, f"step {step}: verified entries"
        assert_same_draft(ours, (list(calls), ref.trace), ref_out, cfg=cfg, step=step)
        deepest.append(int(tree.position_ids.max()))
        if step == 1:
            pairs, root, ids = accept_deepest(s, ids, tree)
    if depth >= 3:  # the selected trees are deep enough to exercise draft levels >= 3
        assert max(deepest) >= 3, deepest
