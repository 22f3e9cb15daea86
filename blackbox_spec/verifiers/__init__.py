"""Verifiers: ways to check a draft against a black-box target."""

from .base import Plan, Verdict, Verifier
from .echo import EchoUnsupported, EchoVerifier
from .fanout import FanoutVerifier

__all__ = ["EchoUnsupported", "EchoVerifier", "FanoutVerifier", "Plan", "Verdict", "Verifier"]
