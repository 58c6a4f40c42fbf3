"""The acceptance rules on hand-made logits: greedy's argmax and ties, padded path slots, typical acceptance's
threshold and ties, and the one threshold formula the page draws."""

import pytest
import torch

from medusa_lib.core.acceptance import (
    greedy_accept,
    greedy_tokens,
    typical_accept,
    typical_threshold,
    typical_threshold_of_entropy,
)


# ------------------------------------------------------------------ acceptance rules
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_greedy_tokens_is_the_argmax_and_ties_go_to_the_first_index(dtype):
    torch.manual_seed(0)
    x = torch.randn(5, 1000).to(dtype)
    x[2, 7] = x[2, 9] = x[2].max() + 1  # a tie
    assert torch.equal(greedy_tokens(x), x.argmax(-1)) and int(greedy_tokens(x)[2]) == 7
    assert int(greedy_tokens(x[3])) == int(x[3].argmax())


def test_padded_slots_are_never_accepted():
    # Two paths: [0, 1, 2] and [0, 3, -1]. The model's argmax everywhere is token 0, and
    # padded slots gather tree position 0 whose token is 0 too: the padding must not pass.
    ri = torch.tensor([[0, 1, 2], [0, 3, -1]])
    tree_tokens = torch.tensor([0, 9, 9, 0])
    logits = torch.full((4, 10), -5.0)
    logits[:, 0] = 5.0
    valid = ri >= 0
    path_tokens = tree_tokens[ri.clamp(min=0)]
    acc, _ = greedy_accept(logits, path_tokens, ri.clamp(min=0), valid)
    assert acc.tolist() == [0, 1]
    acc_t, _ = typical_accept(logits, path_tokens, ri.clamp(min=0), valid, temperature=1.0, epsilon=0.09, delta=0.3)
    assert acc_t.tolist() == [0, 1]


def test_typical_threshold_rule_on_hand_made_distributions():
    V = 100
    uniform = torch.full((V,), 1.0 / V)
    peaked = torch.full((V,), 0.02 / (V - 1))
    peaked[7] = 0.98
    eps, delta = 0.09, 0.3
    # Uniform: H = log V, threshold = min(eps, delta / V) = 0.003 < 1/V = 0.01: any token passes.
    thr_u = typical_threshold(uniform, epsilon=eps, delta=delta)
    assert thr_u.item() == pytest.approx(delta / V, rel=1e-4)
    # Peaked: H ~ 0.13, delta*e^-H ~ 0.26 > eps: the hard threshold epsilon applies.
    thr_p = typical_threshold(peaked, epsilon=eps, delta=delta)
    assert thr_p.item() == pytest.approx(eps)
    logits = torch.log(torch.stack([uniform, peaked, peaked]))
    ri = torch.tensor([[0, 1, 2]])
    for tokens, expected in [([0, 55, 7], 2), ([0, 55, 8], 1), ([0, 55, 55], 1)]:
        path_tokens = torch.tensor([tokens])
        acc, _ = typical_accept(logits, path_tokens, ri, ri >= 0, temperature=1.0, epsilon=eps, delta=delta)
        assert acc.item() == expected, tokens
    # Lower temperature sharpens: at T=0.5 the uniform row stays uniform (still passes).
    acc, _ = typical_accept(logits, torch.tensor([[0, 55, 7]]), ri, ri >= 0, temperature=0.5, epsilon=eps, delta=delta)
    assert acc.item() == 2


def test_typical_ties_go_to_the_higher_log_probability_path():
    probs = torch.tensor([[0.5, 0.3, 0.2], [1 / 3, 1 / 3, 1 / 3], [1 / 3, 1 / 3, 1 / 3]])
    logits = probs.log()
    ri = torch.tensor([[0, 1], [0, 2]])
    path_tokens = torch.tensor([[0, 2], [0, 0]])  # path 0 proposes p=.2, path 1 proposes p=.5
    acc, score = typical_accept(logits, path_tokens, ri, ri >= 0, temperature=1.0, epsilon=0.09, delta=0.3)
    assert acc.tolist() == [1, 1] and int(score.argmax()) == 1


def test_one_threshold_formula_for_acceptance_and_the_page():
    import numpy as np

    from medusa_lib.present.page import threshold_curve

    probs = torch.softmax(torch.randn(6, 50, generator=torch.Generator().manual_seed(0)) * 3, dim=-1)
    # the paper's threshold, written out here: min(epsilon, delta * exp(-H))
    entropy = -(probs * probs.log()).sum(-1)
    assert torch.allclose(
        typical_threshold(probs, epsilon=0.09, delta=0.3),
        torch.clamp(0.3 * torch.exp(-entropy), max=0.09),
        rtol=1e-6,
        atol=0,
    )
    assert torch.allclose(
        typical_threshold_of_entropy(entropy, epsilon=0.09, delta=0.3),
        torch.clamp(0.3 * torch.exp(-entropy), max=0.09),
        rtol=1e-6,
        atol=0,
    )
    h, thr = threshold_curve(epsilon=0.09, delta=0.3, vocab_size=50)
    assert isinstance(thr, np.ndarray) and thr == pytest.approx(np.minimum(0.09, 0.3 * np.exp(-h)), rel=1e-12)
