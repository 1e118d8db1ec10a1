"""Healing after factorisation: :mod:`~svdmlp.compression.heal.closed_form` (``--heal closed-form``: each
down projection refitted to what the compressed gate and up feed it) and
:mod:`~svdmlp.compression.heal.distill` (``--heal lora``: the factors trained towards the dense model)."""
