"""Compression: turn a dense model's MLPs into block-aligned low-rank factors.

Modules, in the order data flows through them:

- :mod:`~svdmlp.compression.pipeline` orders the steps below and does nothing else;
- :mod:`~svdmlp.compression.calibration`: text to token windows (mixtures too), the dense model's
  activation Grams;
- :mod:`~svdmlp.compression.sequential`: layer-by-layer calibration on the already compressed model;
- :mod:`~svdmlp.compression.sensitivity`: what factorising one layer does to the predictions, and the
  ranks allocated from it;
- :mod:`~svdmlp.compression.factorise`: one layer's factorisation, swapped into the model;
- :mod:`~svdmlp.compression.heal`: closed-form (down fitted to the compressed gate/up) and distillation;
- pure math, which any layer of svdmlp may use: :mod:`~svdmlp.compression.decompose` (SVDs, whitening,
  errors) and :mod:`~svdmlp.compression.ranks` (the rank rule, achieved keep, the budget allocation);
- :mod:`~svdmlp.compression.report`: the record of what was done.

Importing this package imports nothing: the tile planner reads :mod:`~svdmlp.compression.ranks` without torch.
"""
