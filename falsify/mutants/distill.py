"""Mutants of the distillation loop (falsify/contracts/distill-v1.yaml): buggy variants of the
loop's
swappable pieces (falsify/llm/distill.DistillParts), each a bug seen in distillation code. The
contract's run functions (falsify/probes/distill.py) build the real loop with whatever the
harness binds."""

from __future__ import annotations

from falsify.llm import distill as D


def freeze_train_mode(module) -> None:
    """The teacher as loaded: train mode (dropout on the targets) and trainable parameters."""
    module.train()


def teacher_reads_targets(x, y):
    """The teacher is fed the targets: its position t sees x_{≤t+1} and predicts y_{t+1}, one
    token ahead of the student it teaches."""
    return y


def numerator_is_mean(loss_mean, n):
    """The micro-batch's mean passed on as its numerator: the step divides it by the step's
    count again, a mean of means scaled by 1/n."""
    return loss_mean


def check_teacher_tokenizer_only(teacher, student_vocab, data) -> None:
    """Only the tokenizer is compared; a teacher over another vocabulary reaches the kernel."""
    D.check_teacher(teacher, teacher.vocab_size, data)
