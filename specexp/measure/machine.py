"""The state of the machine around a measurement: CPU load before and after, and on CUDA the GPU's clocks,
temperature and the other processes on it, wherever they can be read.

Every reading is optional: a field that cannot be read (no ``os.getloadavg`` on this OS, no ``pynvml``, no
``nvidia-smi``) is ``None`` or absent, never an error. GPU readings come from ``pynvml`` when it imports,
else from ``nvidia-smi`` when it is on the PATH (:func:`parse_nvidia_smi`), plus torch's own memory counters.
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


def gpu_state() -> dict:
    """What can be read about the GPU this process uses: torch's memory counters, and clocks (MHz),
    temperature (°C), utilisation (%), power (W) and the other compute processes (pid, MiB) from pynvml or
    nvidia-smi. ``source`` names where the clocks came from (``None``: nowhere)."""
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
    readers = (_from_pynvml, _from_nvidia_smi)
    for reader in readers:
        try:
            found = reader(state.get("index", 0))
        except Exception:  # noqa: BLE001 - a reading, never a failure
            found = None
        if found:
            state.update(found)
            break
    return state


def _from_pynvml(index: int) -> dict | None:
    try:
        import pynvml
    except ImportError:
        return None
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
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


def _from_nvidia_smi(index: int) -> dict | None:
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
