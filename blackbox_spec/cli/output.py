"""How a finished generation is shown: the ``--json`` object and the
one-line stats summary on stderr (the API, batch and local modes alike)."""

from __future__ import annotations

from .._stats import GenerationResult


def _json_object(result: GenerationResult, model: str | None, error: str | None = None) -> dict:
    data = {"text": result.text, "finish_reason": result.finish_reason, "interrupted": result.stats.interrupted, "model": model, "stats": result.stats.to_dict()}
    if error is not None:
        data["error"] = error
    return data


def _summary(result: GenerationResult) -> str:
    s = result.stats
    return (
        f"[bspec] {s.output_tokens} tokens in {s.wall_s:.2f}s ({s.tokens_per_second:.1f} tok/s), "
        f"{s.rounds} rounds, {s.target_calls} calls, acceptance {s.acceptance_rate:.0%}, "
        f"{s.mean_accepted_per_round:.2f} tokens/round, finish: {s.finish_reason}"
        + (f", ~{s.speedup_estimate:.1f}x plain (estimated from the decode rate measured here)" if s.speedup_estimate else "")
        + (f", {s.retries} retried calls" if s.retries else "")
        + (f", {s.failed_rounds} failed rounds resumed" if s.failed_rounds else "")
        + (", then plain decoding (verification kept failing)" if s.fallback and s.fallback.startswith("decoding plainly") else "")
        + (", plain decoding without logprobs (the server's token strings did not fit its text)" if s.token_strings_failed else "")
        + (f", plain chat: {s.notes[0]}" if s.fallback == "plain chat" and s.notes else "")
        + (f", prediction tokens accepted {s.accepted_prediction_tokens}, rejected {s.rejected_prediction_tokens}" if s.accepted_prediction_tokens is not None else "")
        + f"; {s.bill_summary()}"
    )
