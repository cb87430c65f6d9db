"""float64 numpy oracles for falsify/contracts/qlora-finetune-v1.yaml: the SFT token loss, the
reward
weights and the DPO loss, written independently of falsify/llm/finetune.py (no torch) so that
agreement between the two is evidence, not a tautology.
"""

import numpy as np


def _log_softmax64(z):
    z = np.asarray(z, np.float64)
    m = z.max(-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(-1, keepdims=True))


def sft_loss_reference(logits, labels, mask, weights):
    """float64: (Σ_i w_i Σ_t m_it·(−log softmax(z_it)[y_it]), Σ m_it), m also excluding -100."""
    lp = _log_softmax64(logits)
    labels = np.asarray(labels, np.int64)
    m = np.asarray(mask).astype(bool) & (labels != -100)
    tok = -np.take_along_axis(lp, np.where(m, labels, 0)[..., None], -1)[..., 0]
    per = np.where(m, tok, 0.0).sum(-1)
    return float((per * np.asarray(weights, np.float64)).sum()), float(m.sum())


def reward_weights_reference(rewards):
    r = np.clip(np.asarray(rewards, np.float64), -1.0, 1.0)
    lo, hi = r.min(), r.max()
    if not hi > lo:
        raise ValueError("constant rewards: min-max undefined")
    return (r - lo) / (hi - lo)


def dpo_loss_reference(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta):
    """float64, log σ(x) = −log1p(e^{−x}) evaluated stably on both signs."""
    pc, pr, rc, rr = (np.asarray(v, np.float64) for v in (policy_chosen, policy_rejected,
                                                          ref_chosen, ref_rejected))
    c, r = beta * (pc - rc), beta * (pr - rr)
    x = c - r
    return np.logaddexp(0.0, -x), c, r
