"""Compression: turn a dense model's MLPs into block-aligned low-rank factors.

Modules, in the order data flows through them:

- :mod:`~svdmlp.compress.pipeline` orders the steps below and does nothing else;
- :mod:`~svdmlp.compress.calibration`: text to token windows (mixtures too), the dense model's
  activation Grams;
- :mod:`~svdmlp.compress.sequential`: layer-by-layer calibration on the already compressed model;
- :mod:`~svdmlp.compress.sensitivity`: what factorising one layer does to the predictions, and the
  ranks allocated from it;
- :mod:`~svdmlp.compress.factorise`: one layer's factorisation, swapped into the model;
- :mod:`~svdmlp.compress.heal`: closed-form (down fitted to the compressed gate/up) and distillation;
- pure math, which any layer of svdmlp may use: :mod:`~svdmlp.compress.decompose` (SVDs, whitening,
  errors) and :mod:`~svdmlp.compress.ranks` (the rank rule, achieved keep, the budget allocation);
- :mod:`~svdmlp.compress.report`: the record of what was done.

Importing this package imports nothing: the tile planner reads :mod:`~svdmlp.compress.ranks` without torch.
"""
