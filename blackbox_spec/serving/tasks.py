"""Work ``bspec serve`` starts and no request waits for (a dropped client's
close, a refresh of the upstream's model list)."""

from __future__ import annotations

import asyncio


def background(coroutine) -> asyncio.Task:
    """A task that outlives its caller, kept referenced until it ends (the
    event loop holds only weak references to tasks)."""
    task = asyncio.ensure_future(coroutine)
    _TASKS.add(task)
    task.add_done_callback(_TASKS.discard)
    return task


_TASKS: set[asyncio.Task] = set()
