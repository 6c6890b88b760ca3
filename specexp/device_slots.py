"""Which GPUs a local sweep runs its jobs on: the devices it may use, the slots they split into, and which slot
each job gets. Pure: no process is started and CUDA is never touched (the caller passes what is visible).

- ``sweep.devices`` (:func:`parse_devices`): GPU indices, counted as this process sees them (positions in its
  ``CUDA_VISIBLE_DEVICES`` when that is set, else CUDA's own indices); ``null`` = every visible GPU.
- ``sweep.gpus_per_job`` (:func:`split_slots`): the devices split, in order, into slots of that many GPUs;
  devices left over (3 GPUs in slots of 2) stay idle. A job's process gets its slot's GPUs as
  ``CUDA_VISIBLE_DEVICES`` (:meth:`SlotPlan.cuda_visible`), so inside the job they are ``cuda:0``, ``cuda:1``, ...
- :func:`plan_slots` decides whether a sweep runs on slots at all: only its jobs on CUDA, in processes of
  their own (``isolate_sweep_jobs``), launched here (Hydra's basic launcher), with a GPU visible. Otherwise the
  sweep runs as it always did, one job after another, and an explicit ``sweep.devices`` that cannot apply is
  refused with one line.
- :class:`SlotPool`: which job runs in which slot. Jobs wait in the order they were submitted and take the
  lowest free slot; a job that ends, however it ends, frees its slot at once.

:data:`FAKE_GPUS_ENV` is a test hook, documented in docs/design.md: ``SPECEXP_FAKE_GPUS=N`` makes the launcher
act as if N GPUs were visible and every job used them, so the parallel launcher can be exercised on a machine
without GPUs. Fake ids are never checked against hardware, and the records say they were fake.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

from specexp.errors import ConfigError

FAKE_GPUS_ENV = "SPECEXP_FAKE_GPUS"
BASIC_LAUNCHER = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"
_DEVICES_HINT = "use GPU indices such as 0,1 or [0,1] (null = every visible GPU)"


def show_devices(value) -> str:
    """``sweep.devices`` as a user writes it (``0,1``)."""
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


def _index(entry, raw) -> int:
    text = str(entry).strip()
    if isinstance(entry, bool) or not text.isdigit():
        raise ConfigError(f"sweep.devices={show_devices(raw)} is not valid: {text!r} is not a GPU index;"
                          f" {_DEVICES_HINT}")
    return int(text)


def parse_devices(value) -> tuple[int, ...] | None:
    """``sweep.devices`` as GPU indices in the order given; ``None`` (every visible GPU) for null. Accepts an
    int, ``"0,1"``, ``[0, 1]`` or ``["0", "1"]``; :class:`ConfigError` (one line) for anything else, an empty
    list or an index named twice."""
    if value is None:
        return None
    if isinstance(value, str):
        entries = [e for e in value.strip().strip("[]").split(",")]
        if entries == [""]:
            entries = []
    elif isinstance(value, int) and not isinstance(value, bool):
        entries = [value]
    elif isinstance(value, (list, tuple)):
        entries = list(value)
    else:
        raise ConfigError(f"sweep.devices={show_devices(value)} is not valid: {_DEVICES_HINT}")
    if not entries:
        raise ConfigError(f"sweep.devices={show_devices(value)!r} names no GPU: {_DEVICES_HINT}")
    devices = tuple(_index(e, value) for e in entries)
    twice = sorted({d for d in devices if devices.count(d) > 1})
    if twice:
        raise ConfigError(f"sweep.devices={show_devices(value)} names GPU {twice[0]} twice: list each GPU once")
    return devices


def visible_entries(cuda_visible_devices: str | None, device_count: int) -> tuple[str, ...]:
    """What this process's GPU positions 0, 1, ... are called outside it: the first ``device_count`` entries of
    its ``CUDA_VISIBLE_DEVICES`` (indices or UUIDs) when set, else ``"0"``, ``"1"``, ..."""
    if cuda_visible_devices is None:
        return tuple(str(i) for i in range(device_count))
    entries = [e.strip() for e in cuda_visible_devices.split(",") if e.strip()]
    return tuple(entries[:device_count])


def _span(devices: Sequence[int]) -> str:
    return ",".join(str(d) for d in devices)


def split_slots(devices: Sequence[int], gpus_per_job: int) -> tuple[tuple[int, ...], ...]:
    """``devices`` in order, in slots of ``gpus_per_job``; the remainder is left out.
    ``[0, 1, 2, 3, 4]``, 2 -> ``((0, 1), (2, 3))``."""
    count = len(devices) // gpus_per_job
    return tuple(tuple(devices[i * gpus_per_job:(i + 1) * gpus_per_job]) for i in range(count))


@dataclass(frozen=True)
class SlotPlan:
    """A sweep's device slots. ``slots``: per slot, its GPUs as positions in ``visible`` (this process's
    view); ``visible``: the names the GPUs have outside (``CUDA_VISIBLE_DEVICES`` entries); ``idle``: devices
    of ``sweep.devices`` no slot got; ``fake``: the GPUs come from :data:`FAKE_GPUS_ENV`."""

    slots: tuple[tuple[int, ...], ...]
    visible: tuple[str, ...]
    gpus_per_job: int
    idle: tuple[int, ...] = ()
    fake: bool = False

    @property
    def parallel(self) -> bool:
        """More than one job at a time."""
        return len(self.slots) > 1

    def cuda_visible(self, slot: int) -> str:
        """``CUDA_VISIBLE_DEVICES`` of a job in ``slot``."""
        return ",".join(self.visible[d] for d in self.slots[slot])

    def label(self, slot: int) -> str:
        """``GPU 1`` / ``GPUs 2,3``: the slot's devices as ``sweep.devices`` numbers them."""
        devices = self.slots[slot]
        return f"GPU{'s' if len(devices) > 1 else ''} {_span(devices)}"

    def placement(self, slot: int) -> dict:
        """What a job's record says about where it ran (``devices`` as ``sweep.devices`` numbers them)."""
        return {"slot": slot, "devices": list(self.slots[slot]), "cuda_visible_devices": self.cuda_visible(slot),
                "fake_devices": self.fake}


def _one_setting(configs: Sequence[dict], key: str, default):
    values = []
    for cfg in configs:
        value = (cfg.get("sweep") or {}).get(key, default)
        if value not in values:
            values.append(value)
    if len(values) > 1:
        raise ConfigError(f"sweep.{key} differs between the sweep's jobs ({', '.join(map(repr, values))}): set it"
                          " once for the whole sweep")
    return values[0] if values else default


def gpus_needed(cfg: dict) -> int:
    """GPUs one job's process needs: ``engine.tensor_parallel_size`` (1 by default)."""
    return int((cfg.get("engine") or {}).get("tensor_parallel_size") or 1)


def plan_slots(configs: Sequence[dict], launcher: str | None, visible: Sequence[str],
               fake: bool = False) -> SlotPlan | None:
    """The slots of a sweep of the resolved job ``configs`` run by the Hydra ``launcher`` (its ``_target_``)
    with the GPUs ``visible`` (:func:`visible_entries`); ``None`` when the sweep runs one job after another,
    as without slots. ``fake``: ``visible`` comes from :data:`FAKE_GPUS_ENV` (then CPU jobs take slots too).
    :class:`ConfigError` (one line) for a ``sweep.devices`` or ``sweep.gpus_per_job`` that cannot apply."""
    if not configs:
        return None
    raw = _one_setting(configs, "devices", None)
    gpus_per_job = _one_setting(configs, "gpus_per_job", 1)
    devices = parse_devices(raw)
    explicit = f"sweep.devices={show_devices(raw)}" if devices is not None else None
    if launcher is not None and launcher != BASIC_LAUNCHER:
        if explicit or gpus_per_job != 1:
            name = launcher.rsplit(".", 1)[-1]
            raise ConfigError(f"{explicit or f'sweep.gpus_per_job={gpus_per_job}'} applies to sweeps run here; the"
                              f" launcher {name} places its jobs itself (GPUs per job: hydra.launcher.gpus_per_node)")
        return None
    if not visible:
        if explicit:
            raise ConfigError(f"{explicit} names GPUs, and this machine shows none: leave sweep.devices out (the"
                              " sweep then runs its jobs one after another)")
        return None
    if not fake:
        on_cpu = next((i for i, c in enumerate(configs) if (c.get("engine") or {}).get("device") != "cuda"), None)
        if on_cpu is not None:
            if explicit:
                device = (configs[on_cpu].get("engine") or {}).get("device")
                raise ConfigError(f"{explicit}: job {on_cpu} runs on engine.device={device}, and GPU slots are for"
                                  " CUDA jobs: use engine=cuda, or leave sweep.devices out")
            return None
    if not all(c.get("isolate_sweep_jobs", True) for c in configs):
        if explicit:
            raise ConfigError(f"{explicit} runs jobs in processes of their own, and isolate_sweep_jobs=false runs"
                              " them in this one: drop one of them")
        return None
    if devices is None:
        devices = tuple(range(len(visible)))
    unseen = [d for d in devices if d >= len(visible)]
    if unseen:
        shown = f"0-{len(visible) - 1}" if len(visible) > 1 else "0"
        raise ConfigError(f"{explicit}: GPU {unseen[0]} is not visible (this process sees {len(visible)}"
                          f" GPU{'s' if len(visible) > 1 else ''}: {shown})")
    if gpus_per_job > len(devices):
        raise ConfigError(f"sweep.gpus_per_job={gpus_per_job} is more than the {len(devices)} GPU"
                          f"{'s' if len(devices) > 1 else ''} the sweep has ({explicit or 'every visible GPU'}):"
                          " lower it, or give more devices")
    for i, cfg in enumerate(configs):
        need = gpus_needed(cfg)
        if need > gpus_per_job:
            raise ConfigError(f"sweep job {i}: engine.tensor_parallel_size={need} needs {need} GPUs, and"
                              f" sweep.gpus_per_job={gpus_per_job} gives each job {gpus_per_job}: set"
                              f" sweep.gpus_per_job={need}")
    slots = split_slots(devices, gpus_per_job)
    used = {d for slot in slots for d in slot}
    return SlotPlan(slots, tuple(visible), gpus_per_job, tuple(d for d in devices if d not in used), fake)


@dataclass
class SlotPool:
    """Which job runs in which of ``num_slots`` slots. Invariants: a slot holds at most one job; a job waits
    only while every slot is busy; jobs start in the order they were submitted, each in the lowest free slot.
    :meth:`submit` and :meth:`finish` return the ``(job, slot)`` pairs to start now."""

    num_slots: int
    busy: dict = field(default_factory=dict)  # slot -> job
    waiting: deque = field(default_factory=deque)

    def __post_init__(self) -> None:
        if self.num_slots < 1:
            raise ValueError(f"a pool needs at least one slot, got {self.num_slots}")

    def free_slots(self) -> list[int]:
        return [s for s in range(self.num_slots) if s not in self.busy]

    def slot_of(self, job: Hashable) -> int | None:
        return next((s for s, j in self.busy.items() if j == job), None)

    def submit(self, job: Hashable) -> list[tuple[Hashable, int]]:
        """Queue ``job``; returns what starts now (``job`` itself when a slot is free)."""
        if job in self.waiting or self.slot_of(job) is not None:
            raise ValueError(f"job {job!r} was submitted twice")
        self.waiting.append(job)
        return self._assign()

    def finish(self, job: Hashable) -> list[tuple[Hashable, int]]:
        """``job`` ended (ok, failed or interrupted): free its slot; returns what starts in it now."""
        slot = self.slot_of(job)
        if slot is None:
            raise ValueError(f"job {job!r} is not running")
        del self.busy[slot]
        return self._assign()

    def _assign(self) -> list[tuple[Hashable, int]]:
        started = []
        while self.waiting and len(self.busy) < self.num_slots:
            slot = self.free_slots()[0]
            job = self.waiting.popleft()
            self.busy[slot] = job
            started.append((job, slot))
        return started


def env_for_slot(plan: SlotPlan, slot: int, base: Mapping[str, str]) -> dict[str, str]:
    """The environment of a job's process in ``slot``: ``base`` with ``CUDA_VISIBLE_DEVICES`` set to the slot's
    GPUs, and ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` unless ``base`` sets an order, so CUDA numbers GPUs as
    ``nvidia-smi`` does (the noise guard reads the GPU by that number)."""
    env = dict(base)
    env["CUDA_VISIBLE_DEVICES"] = plan.cuda_visible(slot)
    env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    return env
