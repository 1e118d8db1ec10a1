"""Evaluation: perplexity under a pinned protocol, on local text or the literature's data sets."""
