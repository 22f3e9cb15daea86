"""Test helpers shipped with the package: a deterministic fake target."""

from .fake_target import EOS_TEXT, FakeModel, FakeTarget, FakeTokenizer

__all__ = ["EOS_TEXT", "FakeModel", "FakeTarget", "FakeTokenizer"]
