"""Peak memory of a child process, for the benchmarks' memory budgets.

Linux carries ``ru_maxrss`` across fork and execve, so a child started by a big
parent (``make bench`` runs several benchmarks in one process) would report the
parent's peak. ``VmHWM`` in ``/proc/self/status`` belongs to the child's own
address space; ``ru_maxrss`` is the fallback where there is no ``/proc``.
"""

from __future__ import annotations

#: Python source defining ``_peak_bytes()`` in a child script: its own peak RSS, bytes.
PEAK_BYTES_SRC = '''
def _peak_bytes():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
'''
