"""Benchmarks: speed of the fused kernels against dense and unfused baselines and the roofline.

Run as ``svdmlp bench kernel`` (the main CLI) or ``python -m svdmlp.bench kernel``.
"""
