"""Sweeps over keep and method: compress, evaluate, one JSON per finished point, a Markdown report."""
