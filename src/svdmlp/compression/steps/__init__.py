"""The steps of a compression, in the order they run: calibration, allocation, factorisation, healing,
quantization. Each is a module with the step's work over the run's context (:mod:`.context`) and its
predicted peak memory and seconds (``cost``, over :class:`.sizes.Sizes`), side by side, so that a change
to a step is made where its cost is. :func:`svdmlp.compression.pipeline.compress` runs them, and only it
reads and writes the journal of a run that can continue."""

NAMES = ("calibration", "allocation", "factorisation", "healing", "quantization")
