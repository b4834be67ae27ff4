"""`log_failure`: how the host logs its own unexpected failures without leaking anything.

The gateway (an adapter that raised) and the VM host (a worker channel or host call that
failed) log the same way: the exception's type and a correlation id (also given to the
guest's error), never its message, which can hold what the guest sent and so a secret value,
and never `exc_info`, whose frames hold guest state. An operator who needs the traceback
enables the `*.traceback` logger at DEBUG and gets its text, scrubbed of every secret value
the sandbox was handed. Afterwards every traceback in the exception's chain is dropped, so
nothing the failure touched outlives it.
"""

from __future__ import annotations

import logging
import traceback
import uuid
from collections.abc import Mapping

from suaveplan_sandbox.errors._redact import SecretRedactor


def drop_frames(exc: BaseException) -> None:
    """Detach the tracebacks of `exc` and everything it chains to (frames hold guest state)."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        item = todo.pop()
        if item is None or id(item) in seen:
            continue
        seen.add(id(item))
        item.__traceback__ = None
        todo += [item.__cause__, item.__context__]
        if isinstance(item, BaseExceptionGroup):
            todo += list(item.exceptions)


def log_failure(
    log: logging.Logger,
    trace_log: logging.Logger,
    exc: BaseException,
    redactor: SecretRedactor,
    *,
    level: int,
    message: str,
    args: tuple[object, ...],
    fields: Mapping[str, object],
) -> str:
    """Log `message % args` followed by the exception's type and a new correlation id, which
    is returned; the scrubbed traceback only to `trace_log` at DEBUG."""
    correlation = uuid.uuid4().hex[:16]
    kind = redactor.scrub(type(exc).__qualname__)
    extra = {"suaveplan": {**fields, "error_type": kind, "correlation_id": correlation}}
    log.log(level, f"{message} %s (correlation_id=%s)", *args, kind, correlation, extra=extra)
    if trace_log.isEnabledFor(logging.DEBUG):
        text = redactor.scrub("".join(traceback.format_exception(exc)))
        trace_log.debug("traceback (correlation_id=%s):\n%s", correlation, text, extra=extra)
    drop_frames(exc)
    return correlation
