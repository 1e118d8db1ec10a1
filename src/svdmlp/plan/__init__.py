"""Tile planner: which blocks a fused low-rank MLP kernel should use, and what it should cost.

The NeuronMLP paper's analytic model (Eq. 10 arithmetic intensity, Eq. 11 on-chip budget) adapted
to GPUs (shared memory per block, L2 absorbing re-reads) and kept for Trainium, so that the paper's
own block-size study is a test of this code.
"""
