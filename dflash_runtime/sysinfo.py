"""The machine as evidence: ``sys`` samples and the ``machine`` of the ``meta`` record.

Standard library only. Runs on the writer thread (:mod:`dflash_runtime.writer`),
never on the training thread: every ``sys_interval`` seconds (``Recorder(sys_interval=2.0)``,
``TLOG_SYS_INTERVAL``; 0 turns sampling and the machine description off) the writer
calls :meth:`Sampler.sample` and queues the record with the recorder's own.

What a sample reads (docs/FORMAT.md ``sys``), and from where:

- ``cpu``: ``time.process_time()`` (the process's user + system CPU seconds, all threads);
- ``rss``: ``/proc/self/statm`` (Linux), else ``psutil`` when it is importable
  (macOS, Windows), else left out;
- ``threads``, ``running``: ``/proc/self/task/*/stat`` (Linux; state ``R``), else
  ``psutil``'s thread count and no ``running``. The thread taking the sample
  is not counted in ``running`` (it is always running while it samples);
- ``cpu_wait``: the seconds the threads that ran the recorder's iterations spent
  runnable but waiting for a CPU (the scheduler's run-queue delay,
  ``/proc/self/task/<tid>/schedstat``, Linux), summed, cumulative;
- ``ncpu``: ``os.sched_getaffinity(0)`` (the cores this process may use), else
  ``os.cpu_count()``; ``load1``: ``os.getloadavg()``;
- ``cuda``: torch's caching allocator (``torch.cuda.memory_stats(device)``, host-side
  counters, never synchronising), only when ``torch`` is imported and CUDA initialised;
- ``gpu``: NVML through ``pynvml`` (the ``nvidia-ml-py`` package), imported only if
  installed; a query the device does not support is left out and not asked again.

On Linux the shim reads ``/proc`` itself: it is what ``psutil`` reads there, with one
``os.read`` per file. A sample costs about 15 µs plus one small file read per thread
of the process (measured by ``python -m benchmarks sys`` on a 2-core machine at load
8.5: median 15 µs with 1 thread, 282 µs with 33), on the writer thread, every 2 s by
default (at the adaptive pace, :func:`next_gap`, more often in a run's first minute);
the reads release the GIL. Nothing here raises: a field that cannot be read
is left out of the record.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import threading
import time
from typing import Any

from .format import FORMAT_VERSION

#: Default seconds between two ``sys`` samples of a recorder (tlog's choice: a sample
#: costs the writer thread tens of microseconds, so 2 s is far below 0.1% of a core,
#: and a trend over a run of minutes has dozens of points).
DEFAULT_SYS_INTERVAL_S = 2.0
#: Least interval accepted (seconds; tlog's choice: a bound on the sampler's own cost).
MIN_SYS_INTERVAL_S = 0.01
#: Environment variable overriding the default interval (seconds; 0 turns sampling off).
SYS_INTERVAL_ENV = "TLOG_SYS_INTERVAL"
#: With the default interval the pace adapts to the run's age: the gap after a sample is
#: the recorder's age since its first sample over this many (tlog's choice: a run of any
#: length then has about this many samples in each e-fold of its age, 32 in its first
#: 1.6 s and 22 more by 3 s, where the trend tests want 8 and more).
ADAPTIVE_SAMPLES = 32
#: Shortest gap between two samples of the adaptive pace (seconds; tlog's choice: 20
#: samples a second cost the writer thread well under 1% of a core, see
#: :class:`Sampler`; the gap grows to the interval, 2 s by default, after 64 s).
ADAPTIVE_MIN_S = 0.05

_PROC = os.path.isdir("/proc/self/task")
try:
    _PAGE = os.sysconf("SC_PAGE_SIZE")
except (AttributeError, ValueError, OSError):
    _PAGE = 4096
_COUNT_RE = re.compile(r"count\((-?\d+)\)")


def sys_interval(value: float | None) -> float:
    """The sampling interval in seconds: ``value``, else ``$TLOG_SYS_INTERVAL``, else
    :data:`DEFAULT_SYS_INTERVAL_S`; 0 means off.

    Raises ``ValueError`` for a negative value, one below :data:`MIN_SYS_INTERVAL_S`
    other than 0, or an environment value that is not a number (naming the variable).
    """
    if value is None:
        text = os.environ.get(SYS_INTERVAL_ENV, "").strip()
        if not text:
            return DEFAULT_SYS_INTERVAL_S
        try:
            value = float(text)
        except ValueError:
            msg = f"environment variable {SYS_INTERVAL_ENV}={text!r} is not a number of seconds"
            raise ValueError(msg) from None
    value = float(value)
    if value != 0 and not MIN_SYS_INTERVAL_S <= value < float("inf"):
        msg = (f"sys_interval must be 0 (off) or at least {MIN_SYS_INTERVAL_S} seconds, "
               f"got {value!r}")
        raise ValueError(msg)
    return value


def adaptive(value: float | None) -> bool:
    """Whether a recorder given ``sys_interval=value`` samples at the adaptive pace
    (:func:`next_gap`): ``value`` None and ``$TLOG_SYS_INTERVAL`` unset. An interval
    given by either is kept fixed."""
    return value is None and not os.environ.get(SYS_INTERVAL_ENV, "").strip()


def next_gap(interval: float, age: float, *, adapt: bool) -> float:
    """Seconds from one ``sys`` sample to the next (0 when ``interval`` is 0: off).

    Fixed: ``interval``. Adaptive: ``age / ADAPTIVE_SAMPLES`` (``age``: seconds since
    the recorder's first sample) between :data:`ADAPTIVE_MIN_S` and ``interval``, so a
    3-second or 30-step run gets dozens of samples and a long one one per
    ``interval``.
    """
    if not interval or not adapt:
        return interval
    return min(interval, max(ADAPTIVE_MIN_S, age / ADAPTIVE_SAMPLES))


def _read(path: str) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)


def _psutil() -> Any:
    """``psutil.Process()`` of this process when psutil is importable, else None."""
    try:
        import psutil
    except Exception:  # noqa: BLE001 - not installed or broken: leave the fields out
        return None
    try:
        return psutil.Process()
    except Exception:  # noqa: BLE001
        return None


def last_iteration(rec: Any) -> int | None:
    """The number of the last iteration ``rec`` started, or None before the first.

    Read from the repr of the recorder's ``itertools.count`` (``count(N)``: the next
    number), so the training thread stores nothing for it.
    """
    m = _COUNT_RE.fullmatch(repr(getattr(rec, "_counter", None)))
    if m is None:
        return None
    n = int(m.group(1))
    return n - 1 if n > 0 else None


def _device_index(rec: Any, torch: Any) -> int:
    """The torch device ordinal a recorder's process uses: the device of its
    CUDA-timed phases, else ``LOCAL_RANK`` (torchrun's one device per process)
    when there are that many devices, else 0."""
    try:   # the training thread may add a pool meanwhile: list() copies under the GIL
        pools = list(getattr(rec, "_pools", None) or ())
    except RuntimeError:
        pools = []
    used = [d for d in pools if isinstance(d, int) and d >= 0]
    if used:
        return min(used)
    local = os.environ.get("LOCAL_RANK", "")
    if local.isdigit():
        try:
            if int(local) < torch.cuda.device_count():
                return int(local)
        except Exception:  # noqa: BLE001
            return 0
    return 0


def _cuda_ready(torch: Any) -> bool:
    try:
        return bool(torch.cuda.is_initialized())
    except Exception:  # noqa: BLE001
        return False


class Sampler:
    """Takes ``sys`` samples of this process (one per process, shared by its recorders).

    :meth:`sample` costs about 15 µs plus a file read per thread of the process on
    Linux without a GPU (``benchmarks/bench_sys.py``); NVML queries add their own
    (each is a driver call).
    Thread-safe: a lock serialises samples (the writer thread, and a final flush on
    another thread at close or exit).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc = _PROC
        self._ps: Any = None if _PROC else _psutil()
        self._nvml: Any = None       # the pynvml module once initialised; False: none
        self._handles: dict[int, Any] = {}
        self._unsupported: set[str] = set()
        self._machine: dict[str, Any] | None = None

    # -- the process -----------------------------------------------------------------------
    def _threads(self) -> tuple[int | None, int | None]:
        """``(threads, running)`` of this process; the calling thread is not counted
        as running."""
        if not self._proc:
            if self._ps is None:
                return None, None
            try:
                return self._ps.num_threads(), None
            except Exception:  # noqa: BLE001
                return None, None
        try:
            tids = os.listdir("/proc/self/task")
        except OSError:
            return None, None
        me = str(threading.get_native_id())
        running = 0
        for tid in tids:
            if tid == me:
                continue
            data = _read(f"/proc/self/task/{tid}/stat")
            if data is None:   # the thread ended meanwhile
                continue
            end = data.rfind(b")")
            if end >= 0 and data[end + 2:end + 3] == b"R":
                running += 1
        return len(tids), running

    def _rss(self) -> int | None:
        if self._proc:
            data = _read("/proc/self/statm")
            if data:
                parts = data.split()
                if len(parts) > 1:
                    return int(parts[1]) * _PAGE
            return None
        if self._ps is not None:
            try:
                return int(self._ps.memory_info().rss)
            except Exception:  # noqa: BLE001
                return None
        return None

    def _cpu_wait(self, rec: Any) -> float | None:
        """Run-queue wait (s) of the threads that ran ``rec``'s iterations, summed;
        None off Linux, before the first iteration, or when none can be read."""
        if not self._proc:
            return None
        total = None
        for tid in set(getattr(rec, "_threads", ()) or ()):
            data = _read(f"/proc/self/task/{tid}/schedstat")
            parts = data.split() if data else ()
            if len(parts) > 1:
                total = (total or 0) + int(parts[1])
        return None if total is None else total / 1e9

    # -- the device ------------------------------------------------------------------------
    def _cuda(self, rec: Any) -> dict[str, int] | None:
        """``cuda`` of the sample: torch's caching allocator on the process's device,
        only when torch is imported and CUDA initialised (never initialises it)."""
        torch = sys.modules.get("torch")
        if torch is None or not _cuda_ready(torch):
            return None
        try:
            dev = _device_index(rec, torch)
            s = torch.cuda.memory_stats(dev)
        except Exception:  # noqa: BLE001
            return None
        out: dict[str, int] = {}
        for key, stat in (("allocated", "allocated_bytes.all.current"),
                          ("reserved", "reserved_bytes.all.current"),
                          ("retries", "num_alloc_retries")):
            v = s.get(stat)
            if v is not None:
                out[key] = int(v)
        try:
            limit = float(torch.cuda.get_device_properties(dev).total_memory)
            fraction = getattr(torch.cuda, "get_per_process_memory_fraction", None)
            if fraction is not None:
                limit *= min(1.0, float(fraction(dev)))
            out["limit"] = int(limit)
        except Exception:  # noqa: BLE001, S110 - no limit known: left out
            pass
        return out or None

    def _nvml_module(self) -> Any:
        """The initialised ``pynvml`` module, or False (not installed, no driver)."""
        if self._nvml is None:
            self._nvml = False
            try:
                import pynvml

                pynvml.nvmlInit()
                self._nvml = pynvml
            except Exception:  # noqa: BLE001 - no NVML: no gpu fields
                self._nvml = False
        return self._nvml

    def _handle(self, nv: Any, rec: Any) -> Any:
        """The NVML handle of the process's device (by torch's UUID when CUDA is
        initialised, else ``CUDA_VISIBLE_DEVICES``, else the ordinal), or None."""
        torch = sys.modules.get("torch")
        if torch is not None and _cuda_ready(torch):
            dev = _device_index(rec, torch)
        else:
            local = os.environ.get("LOCAL_RANK", "")
            dev = int(local) if local.isdigit() else 0
        if dev in self._handles:
            return self._handles[dev]
        handle = None
        try:
            if torch is not None and _cuda_ready(torch):
                uuid = str(torch.cuda.get_device_properties(dev).uuid)
                handle = nv.nvmlDeviceGetHandleByUUID(
                    uuid if uuid.startswith("GPU-") else "GPU-" + uuid)
        except Exception:  # noqa: BLE001
            handle = None
        if handle is None:
            visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
                       if v.strip()]
            entry = visible[dev] if dev < len(visible) else str(dev)
            try:
                if entry.isdigit():
                    handle = nv.nvmlDeviceGetHandleByIndex(int(entry))
                else:
                    handle = nv.nvmlDeviceGetHandleByUUID(entry)
            except Exception:  # noqa: BLE001
                handle = None
        self._handles[dev] = handle
        return handle

    def _ask(self, key: str, call: Any, *args: Any) -> Any:
        """``call(*args)``, or None when it fails (then ``key`` is not asked again)."""
        if key in self._unsupported:
            return None
        try:
            return call(*args)
        except Exception:  # noqa: BLE001 - NVMLError_NotSupported and the like
            self._unsupported.add(key)
            return None

    def _gpu(self, rec: Any) -> dict[str, float | int] | None:
        """``gpu`` of the sample (NVML), or None without pynvml or a device."""
        nv = self._nvml_module()
        if not nv:
            return None
        h = self._handle(nv, rec)
        if h is None:
            return None
        out: dict[str, float | int] = {}
        util = self._ask("util", nv.nvmlDeviceGetUtilizationRates, h)
        if util is not None:
            out["util"] = float(util.gpu)
        mem = self._ask("mem", nv.nvmlDeviceGetMemoryInfo, h)
        if mem is not None:
            out["mem_used"] = int(mem.used)
            out["mem_total"] = int(mem.total)
        temp = self._ask("temp", nv.nvmlDeviceGetTemperature, h,
                         getattr(nv, "NVML_TEMPERATURE_GPU", 0))
        if temp is not None:
            out["temp"] = float(temp)
        sm = getattr(nv, "NVML_CLOCK_SM", 1)
        clock = self._ask("sm_clock", nv.nvmlDeviceGetClockInfo, h, sm)
        if clock is not None:
            out["sm_clock"] = float(clock)
        top = self._ask("sm_clock_max", nv.nvmlDeviceGetMaxClockInfo, h, sm)
        if top is not None:
            out["sm_clock_max"] = float(top)
        power = self._ask("power", nv.nvmlDeviceGetPowerUsage, h)
        if power is not None:
            out["power"] = power / 1000.0   # NVML reports milliwatts
        reasons = (getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
                   or getattr(nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None))
        if reasons is not None:
            bits = self._ask("throttle", reasons, h)
            if bits is not None:
                out["throttle"] = int(bits)
        return out or None

    # -- the record ------------------------------------------------------------------------
    def sample(self, rec: Any) -> dict[str, Any]:
        """One ``sys`` record (a dict, docs/FORMAT.md) for recorder ``rec``: the fields
        that could be read, ``iter`` always (None before the first iteration)."""
        with self._lock:
            out: dict[str, Any] = {"type": "sys", "v": FORMAT_VERSION,
                                   "ts": round(time.time(), 6), "iter": last_iteration(rec),
                                   "cpu": round(time.process_time(), 6)}
            rss = self._rss()
            if rss is not None:
                out["rss"] = rss
            n = usable_cores()
            if n:
                out["ncpu"] = n
            try:
                out["load1"] = round(os.getloadavg()[0], 4)
            except (AttributeError, OSError):
                pass
            threads, running = self._threads()
            if threads is not None:
                out["threads"] = threads
            if running is not None:
                out["running"] = running
            wait = self._cpu_wait(rec)
            if wait is not None:
                out["cpu_wait"] = round(wait, 6)
            cuda = self._cuda(rec)
            if cuda:
                out["cuda"] = cuda
            gpu = self._gpu(rec)
            if gpu:
                out["gpu"] = gpu
            return out

    def machine(self, rec: Any) -> dict[str, Any]:
        """The ``machine`` of the ``meta`` record (docs/FORMAT.md): what is known,
        the rest None. Computed once per process."""
        with self._lock:
            if self._machine is None:
                self._machine = self._describe(rec)
            return dict(self._machine)

    def _describe(self, rec: Any) -> dict[str, Any]:
        out: dict[str, Any] = dict.fromkeys(("host", "cpu_model", "ncpu", "mem_total",
                                             "gpu_name", "gpu_count", "driver", "cuda"))
        try:
            out["host"] = socket.gethostname()
        except OSError:
            pass
        out["cpu_model"] = _cpu_model()
        out["ncpu"] = os.cpu_count()
        out["mem_total"] = _mem_total()
        torch = sys.modules.get("torch")
        if torch is not None:
            out["cuda"] = getattr(getattr(torch, "version", None), "cuda", None)
        nv = self._nvml_module()
        if nv:
            out["gpu_count"] = self._ask("count", nv.nvmlDeviceGetCount)
            driver = self._ask("driver", nv.nvmlSystemGetDriverVersion)
            out["driver"] = _text(driver)
            h = self._handle(nv, rec)
            if h is not None:
                out["gpu_name"] = _text(self._ask("name", nv.nvmlDeviceGetName, h))
            if out["cuda"] is None:
                v = self._ask("cuda", nv.nvmlSystemGetCudaDriverVersion)
                if isinstance(v, int) and v > 0:
                    out["cuda"] = f"{v // 1000}.{v % 1000 // 10}"
        elif torch is not None and _cuda_ready(torch):
            try:
                out["gpu_count"] = int(torch.cuda.device_count())
                out["gpu_name"] = str(torch.cuda.get_device_name(_device_index(rec, torch)))
            except Exception:  # noqa: BLE001, S110 - unknown: left None
                pass
        return out


def usable_cores() -> int | None:
    """Cores this process may run on: ``os.sched_getaffinity(0)``, else
    ``os.cpu_count()`` (None when neither is known)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def _text(v: Any) -> str | None:
    if v is None:
        return None
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def _cpu_model() -> str | None:
    """The CPU model: ``/proc/cpuinfo`` (``model name``, else ``Model``), else
    ``platform.processor()``, else None."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            text = f.read(65536)
        for key in ("model name", "Model", "Hardware", "cpu model"):
            m = re.search(rf"^{key}\s*:\s*(.+)$", text, flags=re.MULTILINE)
            if m:
                return m.group(1).strip()
    except OSError:
        pass
    try:
        import platform

        return platform.processor() or None
    except Exception:  # noqa: BLE001
        return None


def _mem_total() -> int | None:
    """Bytes of memory of the machine (``sysconf``), or None."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return None


_sampler: Sampler | None = None
_sampler_lock = threading.Lock()


def sampler() -> Sampler:
    """The process's :class:`Sampler` (made at first use; a fork child makes its own)."""
    global _sampler
    with _sampler_lock:
        if _sampler is None:
            _sampler = Sampler()
        return _sampler


def _after_fork_in_child() -> None:
    global _sampler, _sampler_lock
    _sampler = None
    _sampler_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

__all__ = ["ADAPTIVE_MIN_S", "ADAPTIVE_SAMPLES", "DEFAULT_SYS_INTERVAL_S", "SYS_INTERVAL_ENV",
           "Sampler", "adaptive", "last_iteration", "next_gap", "sampler", "sys_interval"]
