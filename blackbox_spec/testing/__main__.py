"""``python -m blackbox_spec.testing --port 8765``: serve the fake target."""

from .fake_target import main

main()
