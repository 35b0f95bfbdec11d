# Copyright (c) Meta Platforms, Inc. and affiliates.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file of github.com/pytorch/torchtitan (BSD 3-Clause License).
"""torchtitan's structured logger, copied without torchtitan (import-free, no network).

The writer side of torchtitan's structured logs as its own code writes them,
from github.com/pytorch/torchtitan at commit
b5bcd76c66d0acb1a08b176d9639425bc55e0b2a (the directory last changed at
ea1db708e5aa18d9ef322733ca821dd021f794c4):

- ``torchtitan/observability/structured_logger/step_state.py``: ``set_step``,
  ``get_step``, ``get_relative_step``, ``get_step_tags``, ``add_step_tag``,
  ``clear_step_tags`` (module globals and ContextVars, as there);
- ``torchtitan/observability/structured_logger/structured_logging.py``:
  ``LogType``, ``ExtraFields``, ``event_extra``, ``TraceEventsOnlyFilter``,
  ``init_structured_logger``, ``log_trace_scalar``, ``log_trace_instant``,
  ``log_trace_span``;
- ``torchtitan/observability/structured_logger/jsonl_handler.py``:
  ``TraceJsonlFormatter`` (every field of ``_log_dict``), ``TraceJsonlHandler``
  (the file name), ``register_jsonl_handler``.

The code is torchtitan's, line for line where it writes a record; changed only
where torchtitan is imported: ``torch.compiler.is_compiling()`` is
``_is_compiling()`` (torch's when torch is imported), the handler factory is
called directly instead of imported by its dotted path (the default factory
only; ``TITAN_STRUCT_LOGGER_HANDLERS`` is not read), and ``reset()`` (tests
only) undoes ``init_structured_logger`` so one process can write two runs.
"""
# torchtitan's code as written there (its os.environ default, explicit returns):
# ruff: noqa: PLW1508, RET501, PYI041

from __future__ import annotations

import asyncio
import datetime as dt
import enum
import functools
import inspect
import itertools
import json
import logging
import os
import random
import socket
import string
import sys
import threading
from collections.abc import Callable
from contextvars import ContextVar
from timeit import default_timer as timer
from typing import Any, TypeVar, cast

F = TypeVar("F", bound=Callable[..., Any])


def _is_compiling() -> bool:
    """``torch.compiler.is_compiling()``; False where torch is not imported (nothing
    can be compiling), so the unit tests need not import torch."""
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.compiler.is_compiling())


# ---- step_state.py -----------------------------------------------------------------

_STEP_GLOBAL: int | None = None
_RELATIVE_STEP_GLOBAL: int | None = None
_TAGS_GLOBAL: tuple[str, ...] = ()

_STEP_CV: ContextVar[int | None] = ContextVar("_STEP_CV", default=None)
_RELATIVE_STEP_CV: ContextVar[int | None] = ContextVar("_RELATIVE_STEP_CV", default=None)
_TAGS_CV: ContextVar[tuple[str, ...]] = ContextVar("_TAGS_CV", default=())


def _is_in_async_task() -> bool:
    try:
        return asyncio.current_task() is not None
    except RuntimeError:
        return False


def set_step(step: int, *, relative_step: int | None = None) -> None:
    """Stamp later records with ``step``; clears the previous step's tags."""
    global _STEP_GLOBAL, _RELATIVE_STEP_GLOBAL
    if relative_step is None:
        relative_step = step
    _STEP_GLOBAL = step
    _STEP_CV.set(step)
    _RELATIVE_STEP_GLOBAL = relative_step
    _RELATIVE_STEP_CV.set(relative_step)
    clear_step_tags()


def get_step() -> int | None:
    """The current step, or None."""
    cv = _STEP_CV.get()
    if cv is not None:
        return cv
    return _STEP_GLOBAL


def get_relative_step() -> int | None:
    """The relative step, or None."""
    cv = _RELATIVE_STEP_CV.get()
    if cv is not None:
        return cv
    return _RELATIVE_STEP_GLOBAL


def get_step_tags() -> tuple[str, ...]:
    """The current step's tags."""
    cv = _TAGS_CV.get()
    if cv:
        return cv
    return _TAGS_GLOBAL


def add_step_tag(tag: str) -> None:
    """Annotate the current step (``"gc"``, ``"eval"``, ``"checkpoint_save"``)."""
    global _TAGS_GLOBAL
    if _is_in_async_task():
        current = _TAGS_CV.get()
        if tag not in current:
            _TAGS_CV.set(current + (tag,))
    else:
        if tag not in _TAGS_GLOBAL:
            _TAGS_GLOBAL = _TAGS_GLOBAL + (tag,)


def clear_step_tags() -> None:
    """Reset step tags."""
    global _TAGS_GLOBAL
    _TAGS_GLOBAL = ()
    _TAGS_CV.set(())


# ---- structured_logging.py ---------------------------------------------------------

console_logger: logging.Logger = logging.getLogger(__name__)
_structured_logger: logging.Logger = logging.getLogger("torchtitan.structured_logger")
_structured_logger.propagate = False
_is_initialized: bool = False
_disabled: bool = False


def _structured_logger_disabled() -> bool:
    return _disabled


class LogType(enum.StrEnum):
    """Record kind in the JSONL stream."""

    EVENT = "event"
    INSTANT = "instant"
    TEXT = "text"


class ExtraFields(enum.StrEnum):
    """Keys for the ``extra`` dict passed to logging calls."""

    LOG_TYPE = "log_type"
    LOG_TYPE_NAME = "log_type_name"
    EVENT_NAME = "event_name"
    STEP = "step"
    VALUE = "value"
    RELATIVE_STEP = "relative_step"
    TASK_NAME = "task_name"


def event_extra(event_type: str, event_name: str | None = None, step: int | None = None,
                relative_step: int | None = None, value: float | int | None = None,
                task_name: str | None = None, log_type: LogType = LogType.EVENT) -> dict[str, Any]:
    """Build the extra dict for a structured JSONL event record."""
    return {
        str(ExtraFields.LOG_TYPE): str(log_type),
        str(ExtraFields.LOG_TYPE_NAME): str(event_type),
        str(ExtraFields.EVENT_NAME): event_name,
        str(ExtraFields.STEP): step,
        str(ExtraFields.RELATIVE_STEP): relative_step,
        str(ExtraFields.VALUE): value,
        str(ExtraFields.TASK_NAME): task_name,
    }


class TraceEventsOnlyFilter(logging.Filter):
    """Drop records that did not come through the ``log_trace_*`` API."""

    def __init__(self) -> None:
        super().__init__()
        self._warned = False

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, str(ExtraFields.LOG_TYPE_NAME), None) is not None:
            return True
        if not self._warned:
            self._warned = True
            console_logger.warning("Plain-text record on the structured logger was dropped. "
                                   "Use log_trace_span / log_trace_scalar / log_trace_instant.")
        return False


def init_structured_logger(source: str, output_dir: str, rank: int | None = None,
                           enable: bool = True) -> None:
    """Attach the JSONL handler to the structured logger; once per process."""
    global _is_initialized, _disabled
    if not enable:
        _disabled = True
        return
    if _is_initialized:
        return
    if rank is None:
        rank = int(os.environ.get("RANK", 0))
    register_jsonl_handler(structured_logger=_structured_logger, rank=rank, source=source,
                           output_dir=output_dir)
    if _structured_logger.level == logging.NOTSET or _structured_logger.level > logging.INFO:
        _structured_logger.setLevel(logging.INFO)
    _is_initialized = True


def reset() -> None:
    """Tests only: close and remove the handlers, forget the step (not torchtitan's)."""
    global _is_initialized, _disabled, _STEP_GLOBAL, _RELATIVE_STEP_GLOBAL
    for h in list(_structured_logger.handlers):
        _structured_logger.removeHandler(h)
        h.close()
    _is_initialized = _disabled = False
    _STEP_GLOBAL = _RELATIVE_STEP_GLOBAL = None
    _STEP_CV.set(None)
    _RELATIVE_STEP_CV.set(None)
    clear_step_tags()


def log_trace_scalar(scalars: dict[str, float | int], *, stacklevel: int = 2) -> None:
    """Emit a ``metric_value`` record per (name, value) pair."""
    if _structured_logger_disabled() or _is_compiling():
        return
    step = get_step()
    bad_keys: list[str] = []
    for name, value in scalars.items():
        if not isinstance(value, float | int) or isinstance(value, bool):
            bad_keys.append(name)
            continue
        _structured_logger.info(
            f"[step {step if step is not None else 'N/A'}] {name}={value}",
            extra=event_extra("metric_value", event_name=name, value=value, step=step,
                              log_type=LogType.INSTANT),
            stacklevel=stacklevel,
        )
    if bad_keys:
        console_logger.warning("log_trace_scalar skipped non-numeric values for keys: %s",
                               bad_keys)


def log_trace_instant(event_type: str, *, stacklevel: int = 2) -> None:
    """Emit a zero-duration marker."""
    if _is_compiling() or _structured_logger_disabled():
        return
    _structured_logger.info(str(event_type), extra=event_extra(event_type, log_type=LogType.INSTANT),
                            stacklevel=stacklevel)


class log_trace_span:
    """Time a block of work; emits ``_start`` and ``_end`` (``value``: elapsed ms)."""

    def __init__(self, event_type: str, description: str | None = None, *,
                 stacklevel: int = 2):
        self.base_name = str(event_type)
        self.description = description
        self.stacklevel = stacklevel
        self.start_time: float = 0.0
        self._task_name: str | None = None
        self.start_type_name = self.base_name + "_start"
        self.end_type_name = self.base_name + "_end"

    def __enter__(self):
        if _is_compiling() or _structured_logger_disabled():
            return self
        try:
            task = asyncio.current_task()
            self._task_name = task.get_name() if task else None
        except RuntimeError:
            self._task_name = None
        display_name = self.description or self.base_name
        self.start_time = timer()
        step = get_step()
        _structured_logger.info(
            f"[step {step if step is not None else 'N/A'}] {display_name} {self.start_type_name}",
            extra=event_extra(self.start_type_name, step=step, task_name=self._task_name),
            stacklevel=self.stacklevel,
        )
        return self

    def __exit__(self, exc_type, exc_val, exc_tb):
        if _is_compiling() or _structured_logger_disabled():
            return None
        end_time = timer()
        step = get_step()
        duration_s = end_time - self.start_time
        delta_ms = duration_s * 1000
        if exc_type is not None:
            error_type_name = self.base_name + "_error"
            _structured_logger.info(
                f"[step {step if step is not None else 'N/A'}] {error_type_name}: "
                f"{exc_type.__name__}: {exc_val}",
                extra=event_extra(error_type_name, step=step, task_name=self._task_name),
                stacklevel=self.stacklevel,
            )
        _structured_logger.info(
            f"[step {step if step is not None else 'N/A'}] {self.end_type_name} took "
            f"{delta_ms:.2f} ms",
            extra=event_extra(self.end_type_name, value=delta_ms, step=step,
                              task_name=self._task_name),
            stacklevel=self.stacklevel,
        )
        return None

    def __call__(self, func: F) -> F:
        base_name, description, stacklevel = self.base_name, self.description, self.stacklevel
        if inspect.iscoroutinefunction(func):
            @functools.wraps(func)
            async def async_wrapper(*args, **kwargs):
                with log_trace_span(base_name, description, stacklevel=stacklevel):
                    return await func(*args, **kwargs)
            return cast(F, async_wrapper)

        @functools.wraps(func)
        def sync_wrapper(*args, **kwargs):
            with log_trace_span(base_name, description, stacklevel=stacklevel + 1):
                return func(*args, **kwargs)
        return cast(F, sync_wrapper)


# ---- jsonl_handler.py --------------------------------------------------------------

MAX_MESSAGE_SIZE: int = 1000


class TraceJsonlFormatter(logging.Formatter):
    """Format trace records as one JSON line per record."""

    def __init__(self, rank: int, source: str):
        super().__init__()
        self.rank = rank
        self.source = source
        self._local_rank = int(os.environ.get("LOCAL_RANK", 0))
        self._host_name = socket.gethostname()
        self._seq_counter = itertools.count()
        self._thread_local = threading.local()

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(self._log_dict(record))

    def _log_dict(self, record: logging.LogRecord) -> dict[str, Any]:
        log_dict: dict[str, Any] = {}
        log_dict["delta_ms"] = self._refresh_event_delta()
        log_dict["tid"] = threading.get_native_id()
        log_dict["rank"] = self.rank
        log_dict["global_rank"] = self.rank
        log_dict["local_rank"] = self._local_rank
        log_dict["source"] = self.source
        log_dict["host_name"] = self._host_name
        log_dict["pid"] = os.getpid()
        step = get_step()
        if step is not None:
            log_dict["step"] = step
        relative_step = get_relative_step()
        if relative_step is not None:
            log_dict["relative_step"] = relative_step
        step_tags = get_step_tags()
        if step_tags:
            log_dict["step_tags"] = list(step_tags)
        log_dict["time"] = int(record.created)
        log_dict["time_ms"] = int(record.created * 1000)
        log_dict["time_us"] = int(record.created * 1_000_000)
        log_dict["log_type"] = getattr(record, str(ExtraFields.LOG_TYPE), str(LogType.TEXT))
        log_type_name = getattr(record, str(ExtraFields.LOG_TYPE_NAME), None)
        log_dict["log_type_name"] = log_type_name
        record_step = getattr(record, str(ExtraFields.STEP), None)
        if record_step is not None:
            log_dict["step"] = record_step
        record_relative_step = getattr(record, str(ExtraFields.RELATIVE_STEP), None)
        if record_relative_step is not None:
            log_dict["relative_step"] = record_relative_step
        log_dict["event_name"] = getattr(record, str(ExtraFields.EVENT_NAME), None)
        value = getattr(record, str(ExtraFields.VALUE), None)
        if isinstance(value, float | int):
            log_dict["value"] = float(value)
        task_name = getattr(record, str(ExtraFields.TASK_NAME), None)
        if task_name is not None:
            log_dict["task_name"] = task_name
        log_dict["caller"] = f"{os.path.relpath(record.pathname)}:{record.lineno}:{record.funcName}"
        log_dict["log_file"] = record.filename
        log_dict["log_function"] = record.funcName
        log_dict["log_level"] = record.levelname
        log_dict["logger_name"] = record.name
        if record.stack_info:
            log_dict["stack_info"] = record.stack_info
        log_dict["seq_id"] = next(self._seq_counter)
        message = record.getMessage()
        if message is not None:
            if len(message) <= MAX_MESSAGE_SIZE:
                log_dict["message"] = message
            else:
                half = MAX_MESSAGE_SIZE // 2
                log_dict["message"] = message[:half] + "..." + message[-half:]
        return log_dict

    def _refresh_event_delta(self) -> float:
        if not hasattr(self._thread_local, "last_event_time"):
            self._thread_local.last_event_time = timer()
        event_delta = (timer() - self._thread_local.last_event_time) * 1000
        self._thread_local.last_event_time = timer()
        return event_delta


class TraceJsonlHandler(logging.FileHandler):
    """Per-rank JSONL file handler:
    ``{output_dir}/structured_logs/{source}.global_rank_{rank}.{timestamp}-{random}.jsonl``."""

    def __init__(self, rank: int, source: str, output_dir: str):
        timestamp_str = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        random_str = "".join(random.choice(string.ascii_uppercase + string.digits)
                             for _ in range(6))
        filename = f"{source}.global_rank_{rank}.{timestamp_str}-{random_str}.jsonl"
        filepath = os.path.join(output_dir, "structured_logs", filename)
        os.makedirs(os.path.dirname(filepath), exist_ok=True)
        super().__init__(filename=filepath)
        self.setFormatter(TraceJsonlFormatter(rank=rank, source=source))
        self.addFilter(TraceEventsOnlyFilter())


def register_jsonl_handler(*, structured_logger: logging.Logger, rank: int, source: str,
                           output_dir: str, **kw: Any) -> None:
    """Default factory: attach a ``TraceJsonlHandler`` to the structured logger."""
    handler = TraceJsonlHandler(rank=rank, source=source, output_dir=output_dir)
    structured_logger.addHandler(handler)
