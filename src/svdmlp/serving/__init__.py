"""Running svdmlp checkpoints in the engines users deploy: transformers (a quantizer registered with it)
and vLLM (a plugin), both reading the ``quantization_config`` of :mod:`svdmlp.serving.quant_config`."""
