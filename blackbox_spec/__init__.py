"""blackbox_spec: exact speculative decoding for black-box LLM APIs."""

from ._exceptions import (
    AuthenticationError,
    BlackboxSpecError,
    ConfigurationError,
    ModelNotFoundError,
    NondeterministicTargetError,
    PromptError,
    TargetConnectionError,
    TargetError,
    TargetHTTPError,
    TargetResponseError,
    TokenizerError,
)
from ._retry import RetryPolicy
from ._stats import GenerationResult, GenerationStats, Piece
from .client import Capabilities, GenerationStream, SpecClient
from .drafters import Drafter, NGramDrafter
from .policy import Policy
from .verifiers import EchoVerifier, FanoutVerifier, Plan, Verdict, Verifier

__version__ = "0.1.0"

__all__ = [
    "AuthenticationError",
    "BlackboxSpecError",
    "Capabilities",
    "ConfigurationError",
    "Drafter",
    "EchoVerifier",
    "FanoutVerifier",
    "GenerationResult",
    "GenerationStats",
    "GenerationStream",
    "ModelNotFoundError",
    "NondeterministicTargetError",
    "Piece",
    "NGramDrafter",
    "Plan",
    "Policy",
    "PromptError",
    "RetryPolicy",
    "SpecClient",
    "TargetConnectionError",
    "TargetError",
    "TargetHTTPError",
    "TargetResponseError",
    "TokenizerError",
    "Verdict",
    "Verifier",
    "__version__",
]
