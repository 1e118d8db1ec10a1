"""Healing after factorisation: :mod:`~svdmlp.compress.heal.closed_form` (``--heal closed-form``: each
down projection refitted to what the compressed gate and up feed it) and
:mod:`~svdmlp.compress.heal.distill` (``--heal lora``: the factors trained towards the dense model)."""
