"""Healing by distillation (``--heal lora``): the factors trained to match the dense model's next-token
distribution on windows of their own, judged on validation windows of every calibration source. A model
on disk is trained layer by layer from its files, or loaded whole where memory allows."""

from __future__ import annotations

from svdmlp.compression.calibration import tokens_hash, training_and_validation
from svdmlp.compression.heal import distill
from svdmlp.compression.steps import sizes
from svdmlp.compression.steps.context import Run
from svdmlp.compression.steps.sizes import BASE_BYTES, F32, LOGIT_COPIES, Sizes

# Validation windows of each calibration source on which distillation healing is judged.
HEAL_VALIDATION = 1


def heal(run: Run, teacher: distill.DenseTeacher) -> dict:
    """Run :func:`distill.distill` on windows of its own (training and, per calibration source,
    validation windows disjoint from them); what the report records of it."""
    config, lora = run.config, run.config.lora
    with teacher.active():  # ``self`` windows are sampled by the dense model
        training, validation = training_and_validation(
            run.tokenizer,
            config,
            run.calibration_text,
            lora.steps,
            lora.seq_len,
            config.seed + 1,
            run.windows.bos,
            HEAL_VALIDATION,
            run.model,
        )
    result = distill.distill(
        run.model, teacher, training, validation, lora, progress=run.progress, resident=run.resident_healing
    )
    return {
        "method": "lora",
        **result.to_dict(),
        "lr": lora.lr,
        "relative_lr": lora.relative_lr,
        "seq_len": lora.seq_len,
        "sha256": tokens_hash(training),
    }


def cost(s: Sizes, resident: bool) -> tuple[float, float] | None:
    """(peak bytes, seconds) of distillation, the model on disk or loaded whole (``resident``); None
    without it."""
    config, shapes = s.config, s.shapes
    if not config.heals_lora:
        return None
    h, i, vocab, window = s.h, s.i, shapes.vocab, config.lora.seq_len + 1
    teacher_logits = window * vocab * F32  # one window's, float32
    if not resident:  # a layer, its factors' gradients and AdamW state, inputs
        layer_factors = 3 * (h + i) * s.rank * F32
        step = s.layer + 3 * layer_factors + shapes.layers * window * h * F32
        # The embeddings and the head are loaded one at a time, for the passes that use them; the
        # teacher's logits are whole, the student's formed a few rows at a time (layer_inputs.block_rows).
        logits = teacher_logits + sizes.logit_block(window, vocab) * LOGIT_COPIES * 2
        memory = s.model + max(vocab * h * F32 + logits, step)
    else:  # the whole model, every factor's gradient and AdamW state, the logits, and what
        # autograd keeps of every layer (attention probabilities, a few activations per width)
        factors = s.compressed * 3 * (h + i) * s.rank
        kept = shapes.layers * sizes.layer_record(shapes, window)
        logits = teacher_logits * LOGIT_COPIES * 2  # the teacher's and the student's, whole
        memory = BASE_BYTES + shapes.params * F32 + factors * 3 * F32 + logits + kept
    return memory, config.lora.steps * 4 * 2 * shapes.params * config.lora.seq_len / s.speed.f32
