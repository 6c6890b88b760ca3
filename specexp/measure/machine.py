"""The state of the machine around a measurement: CPU load before and after, and on CUDA the GPU's clocks,
temperature and the other processes on it, wherever they can be read.

Every reading is optional: a field that cannot be read (no ``os.getloadavg`` on this OS, no ``pynvml``, no
``nvidia-smi``) is ``None`` or absent, never an error. GPU readings come from ``pynvml`` when it imports,
else from ``nvidia-smi`` when it is on the PATH (:func:`parse_nvidia_smi`), plus torch's own memory counters.
Both tools number GPUs as the machine does, not as ``CUDA_VISIBLE_DEVICES`` shows them to this process, so
the GPU read is the one this process's device stands for (:func:`physical_gpu`).
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import subprocess
import sys
import time

NVIDIA_SMI_TIMEOUT_S = 5.0
GPU_QUERY = ("index", "clocks.sm", "clocks.mem", "clocks.max.sm", "temperature.gpu", "utilization.gpu",
             "power.draw")
APPS_QUERY = ("pid", "used_memory")


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (runnable + uninterruptible processes), ``None`` where unknown."""
    try:
        return [round(v, 3) for v in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def cpu_count() -> int | None:
    """The CPUs this process may run on (its affinity mask where the OS has one, else all of them)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def snapshot(device: str = "cpu") -> dict:
    """The machine now: ``time`` (ISO), ``load_avg`` ([1, 5, 15] min), ``cpu_count``, ``process_cpu_s`` (this
    process's CPU seconds so far, all threads) and, when ``device`` is CUDA, ``gpu`` (:func:`gpu_state`)."""
    state = {
        "time": dt.datetime.now().isoformat(timespec="seconds"),
        "load_avg": load_average(),
        "cpu_count": cpu_count(),
        "process_cpu_s": round(time.process_time(), 3),
    }
    if str(device).startswith("cuda"):
        state["gpu"] = gpu_state()
    return state


def physical_gpu(index: int, cuda_visible_devices: str | None) -> int | str | None:
    """The machine's name for this process's CUDA device ``index``: its entry of ``cuda_visible_devices``
    (an index as an int, a ``GPU-...`` UUID as a string), ``index`` itself when that is unset, ``None`` when
    the entry cannot be read by pynvml or nvidia-smi (a MIG instance) or is missing."""
    if cuda_visible_devices is None:
        return index
    entries = [e.strip() for e in cuda_visible_devices.split(",") if e.strip()]
    if index >= len(entries):
        return None
    entry = entries[index]
    if entry.isdigit():
        return int(entry)
    return entry if entry.startswith("GPU-") else None


def gpu_state() -> dict:
    """What can be read about the GPU this process uses: torch's memory counters, and clocks (MHz),
    temperature (°C), utilisation (%), power (W) and the other compute processes (pid, MiB) from pynvml or
    nvidia-smi. ``source`` names where the clocks came from (``None``: nowhere); ``physical_index``: the
    machine's name for the GPU (:func:`physical_gpu`)."""
    state: dict = {"source": None}
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                free, total = torch.cuda.mem_get_info()
                state.update(name=torch.cuda.get_device_name(), index=torch.cuda.current_device(),
                             memory_allocated_bytes=torch.cuda.memory_allocated(),
                             memory_reserved_bytes=torch.cuda.memory_reserved(),
                             memory_free_bytes=free, memory_total_bytes=total)
        except Exception as e:  # noqa: BLE001 - a reading, never a failure
            state["torch_error"] = type(e).__name__
    physical = physical_gpu(state.get("index", 0), os.environ.get("CUDA_VISIBLE_DEVICES"))
    state["physical_index"] = physical
    readers = (_from_pynvml, _from_nvidia_smi) if physical is not None else ()
    for reader in readers:
        try:
            found = reader(physical)
        except Exception:  # noqa: BLE001 - a reading, never a failure
            found = None
        if found:
            state.update(found)
            break
    return state


def _from_pynvml(index: int | str) -> dict | None:
    try:
        import pynvml
    except ImportError:
        return None
    pynvml.nvmlInit()
    try:
        handle = (pynvml.nvmlDeviceGetHandleByUUID(index) if isinstance(index, str)
                  else pynvml.nvmlDeviceGetHandleByIndex(index))
        apps = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        return {
            "source": "pynvml",
            "sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
            "memory_clock_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM),
            "max_sm_clock_mhz": pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM),
            "temperature_c": pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
            "utilization_pct": pynvml.nvmlDeviceGetUtilizationRates(handle).gpu,
            "power_w": pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
            "processes": [{"pid": p.pid, "used_memory_mib": (p.usedGpuMemory or 0) / 2**20} for p in apps],
        }
    finally:
        pynvml.nvmlShutdown()


def _from_nvidia_smi(index: int | str) -> dict | None:
    if shutil.which("nvidia-smi") is None:
        return None

    def query(what: str, fields: tuple) -> str:
        return subprocess.run(["nvidia-smi", f"--id={index}", f"--query-{what}={','.join(fields)}",
                               "--format=csv,noheader,nounits"], capture_output=True, text=True, check=True,
                              timeout=NVIDIA_SMI_TIMEOUT_S).stdout

    return parse_nvidia_smi(query("gpu", GPU_QUERY), query("compute-apps", APPS_QUERY))


def _number(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


def parse_nvidia_smi(gpu_csv: str, apps_csv: str) -> dict | None:
    """The fields of :func:`gpu_state` from ``nvidia-smi --query-gpu=<GPU_QUERY>`` and
    ``--query-compute-apps=<APPS_QUERY>`` (``--format=csv,noheader,nounits``) output; ``None`` for an empty
    GPU line. Values nvidia-smi cannot give (``[N/A]``) are ``None``."""
    lines = [line for line in gpu_csv.strip().splitlines() if line.strip()]
    if not lines:
        return None
    values = dict(zip(GPU_QUERY, (_number(v) for v in lines[0].split(","))))
    processes = []
    for line in apps_csv.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == len(APPS_QUERY) and parts[0].isdigit():
            processes.append({"pid": int(parts[0]), "used_memory_mib": _number(parts[1])})
    return {"source": "nvidia-smi", "sm_clock_mhz": values.get("clocks.sm"),
            "memory_clock_mhz": values.get("clocks.mem"), "max_sm_clock_mhz": values.get("clocks.max.sm"),
            "temperature_c": values.get("temperature.gpu"), "utilization_pct": values.get("utilization.gpu"),
            "power_w": values.get("power.draw"), "processes": processes}


def parent_pid(pid: int) -> int | None:
    """The parent of process ``pid`` (Linux ``/proc``), ``None`` where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def descends_from(pid: int, ancestor: int, max_depth: int = 8) -> bool:
    """Whether process ``pid`` is a child, grandchild, ... (up to ``max_depth`` levels) of ``ancestor``."""
    for _ in range(max_depth):
        found = parent_pid(pid)
        if found is None or found <= 1:
            return False
        if found == ancestor:
            return True
        pid = found
    return False


def related_gpu_pids(readings: list[dict | None], own_pid: int, sibling_parent: int | None = None) -> list[int]:
    """The compute processes of the GPU ``readings`` (:func:`snapshot`) that belong to this run: descendants
    of ``own_pid`` (a backend's engine core or tensor-parallel workers) and, with ``sibling_parent``, its
    children (the other jobs of a sweep measuring in rounds)."""
    pids = {p["pid"] for reading in readings for p in ((reading or {}).get("gpu") or {}).get("processes") or []}
    related = {pid for pid in pids if descends_from(pid, own_pid)}
    if sibling_parent is not None:
        related |= {pid for pid in pids if parent_pid(pid) == sibling_parent}
    return sorted(related)
