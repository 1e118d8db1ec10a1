"""Compression: turn a dense model's MLPs into block-aligned low-rank factors.

Modules, bottom up (each imports only those below it: tests/test_svdmlp.py, COMPRESSION_LAYERS):

- Grams and windows: :mod:`~svdmlp.compression.gram`, :mod:`~svdmlp.compression.layer_inputs`,
  :mod:`~svdmlp.compression.output_grams` (the dense model's output-gradient Grams),
  :mod:`~svdmlp.compression.calibration` (text to token windows, mixtures, the activation Grams);
- one layer at a time: :mod:`~svdmlp.compression.sequential` (calibration on the already compressed
  model), :mod:`~svdmlp.compression.factorise` (one layer's factorisation, swapped into the model),
  :mod:`~svdmlp.compression.sensitivity` (what factorising a layer does to the predictions),
  :mod:`~svdmlp.compression.heal` (closed form, distillation), quantized factors and dense baselines;
- :mod:`~svdmlp.compression.steps`: the steps of a compression, each with its cost;
- :mod:`~svdmlp.compression.journal` (a stopped run's progress), :mod:`~svdmlp.compression.pipeline`
  (runs the steps), :mod:`~svdmlp.compression.footprint` (their predicted memory and time),
  :mod:`~svdmlp.compression.workspace` (the work directory beside an output, its lock and checks);
- :mod:`~svdmlp.compression.report`: the record of what was done.

The pure math any layer of svdmlp may use lives outside: :mod:`svdmlp.decompose` (SVDs, whitening,
errors) and :mod:`svdmlp.ranks` (the rank rule, achieved keep, the budget allocation). Importing this
package imports nothing.
"""
