"""What the suite reads from NVML (optional): names, PCIe links, health counters, XID events and
throttle reasons sampled while COMPUTE runs. Every read degrades to None."""

import os
import threading
from typing import Any

XID_CRITICAL = 0x0000000000000008  # nvmlEventTypeXidCriticalError
CLOCK_SM = 1  # nvmlClockType_t NVML_CLOCK_SM
TEMPERATURE_GPU = 0  # nvmlTemperatureSensors_t NVML_TEMPERATURE_GPU
# nvmlNvLinkErrorCounter_t: the data-link layer's counters of one NVLink
NVLINK_ERRORS = {"replay": 0, "recovery": 1, "crc_flit": 2, "crc_data": 3}
LINK_ERRORS = (*NVLINK_ERRORS, "pcie_replay")


class Nvml:
    """What the suite reads from NVML; every method degrades to None when NVML cannot answer."""

    def __init__(self) -> None:
        self.nv: Any = None
        self.error: str | None = None
        self.bindings: str | None = None
        self.handles: dict[int, Any] = {}  # CUDA index -> NVML handle
        self.events: Any = None
        self.xids: dict[int | None, list[int]] = {}
        self.throttle: dict[int, set[str]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            from gpuctl.node.readers import bindings

            pynvml, self.bindings = bindings.load()  # the agent's choice: node's own or bundled
            pynvml.nvmlInit()
            self.nv = pynvml
        except Exception as e:  # ImportError, NVMLError, missing libnvidia-ml
            self.error = f"{type(e).__name__}: {e}"

    def _call(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception:
            return None

    def map_devices(self, torch: Any, count: int) -> None:
        """Match CUDA devices to NVML handles by UUID (CUDA_VISIBLE_DEVICES reorders them)."""
        if self.nv is None:
            return
        for i in range(count):
            props = torch.cuda.get_device_properties(i)
            uuid = getattr(props, "uuid", None)
            handle = None
            if uuid is not None:
                text = str(uuid)
                if not text.startswith("GPU-"):
                    text = f"GPU-{text}"
                handle = self._call(self.nv.nvmlDeviceGetHandleByUUID, text)
            if handle is None and "CUDA_VISIBLE_DEVICES" not in os.environ:
                handle = self._call(self.nv.nvmlDeviceGetHandleByIndex, i)
            if handle is not None:
                self.handles[i] = handle
        self._watch_xids()

    def map_indices(self) -> int:
        """Every GPU NVML sees, by NVML's index (a run without torch: ``--prolog``); returns
        how many."""
        count = self.device_count() or 0
        for i in range(count):
            handle = self._call(self.nv.nvmlDeviceGetHandleByIndex, i)
            if handle is not None:
                self.handles[i] = handle
        self._watch_xids()
        return count

    def vbios(self, i: int) -> "str | None":
        h = self.handles.get(i)
        v = self._call(self.nv.nvmlDeviceGetVbiosVersion, h) if h is not None else None
        return _text(v)

    def memory_total(self, i: int) -> "int | None":
        h = self.handles.get(i)
        info = self._call(self.nv.nvmlDeviceGetMemoryInfo, h) if h is not None else None
        total = getattr(info, "total", None)
        return int(total) if isinstance(total, int) else None

    def _watch_xids(self) -> None:
        self.events = self._call(self.nv.nvmlEventSetCreate)
        if self.events is not None:
            for h in self.handles.values():
                self._call(self.nv.nvmlDeviceRegisterEvents, h, XID_CRITICAL, self.events)

    def device_count(self) -> "int | None":
        """Every GPU NVML sees on the node (CUDA_VISIBLE_DEVICES hides none of them)."""
        if self.nv is None:
            return None
        n = self._call(self.nv.nvmlDeviceGetCount)
        return int(n) if isinstance(n, int) else None

    def driver(self) -> "str | None":
        if self.nv is None:
            return None
        v = self._call(self.nv.nvmlSystemGetDriverVersion)
        return _text(v)

    def uuid(self, i: int) -> "str | None":
        h = self.handles.get(i)
        v = self._call(self.nv.nvmlDeviceGetUUID, h) if h is not None else None
        return _text(v)

    def pcie(self, i: int) -> "tuple[Any, Any, Any, Any]":
        """(current gen, current width, max gen, max width) of GPU i, each None if unknown."""
        h = self.handles.get(i)
        if h is None:
            return None, None, None, None
        nv = self.nv
        return (
            self._call(nv.nvmlDeviceGetCurrPcieLinkGeneration, h),
            self._call(nv.nvmlDeviceGetCurrPcieLinkWidth, h),
            self._call(nv.nvmlDeviceGetMaxPcieLinkGeneration, h),
            self._call(nv.nvmlDeviceGetMaxPcieLinkWidth, h),
        )

    def poll_xids(self) -> None:
        """Drain the XID events NVML queued since ENV (timeout 0: never waits)."""
        if self.events is None:
            return
        wait = getattr(self.nv, "nvmlEventSetWait_v2", None) or self.nv.nvmlEventSetWait
        nvml_index = {self._call(self.nv.nvmlDeviceGetIndex, h): i for i, h in self.handles.items()}
        for _ in range(10000):  # bounded: a storm of events must not hang the suite
            data = self._call(wait, self.events, 0)
            if data is None:
                return
            gpu = nvml_index.get(self._call(self.nv.nvmlDeviceGetIndex, data.device))
            self.xids.setdefault(gpu, []).append(int(data.eventData))

    def _sample_throttle(self) -> None:
        from gpuctl.node.protocol import decode_throttle

        # Newer NVML names them "clock event reasons"; the bits are the same.
        read = (
            getattr(self.nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
            or self.nv.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        while True:
            for i, h in self.handles.items():
                for name in decode_throttle(self._call(read, h)) or ():
                    self.throttle.setdefault(i, set()).add(name)
            if self._stop.wait(0.2):
                return

    def throttle_now(self) -> None:
        """One reading of every GPU's throttle reasons (no load ran to watch: ``--prolog``)."""
        if self.nv is None or not self.handles:
            return
        self._stop.set()
        self._sample_throttle()

    def start_throttle_watch(self) -> None:
        if self.nv is None or not self.handles:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._sample_throttle, daemon=True)
        self._thread.start()

    def stop_throttle_watch(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(2.0)
            self._thread = None

    def health(self, i: int) -> "dict[str, Any]":
        """ECC and remapped-row counters of GPU i (None where unsupported)."""
        h = self.handles.get(i)
        out: dict[str, Any] = {
            "ecc_uncorrected_volatile": None,
            "ecc_uncorrected_aggregate": None,
            "remapped_rows": None,
        }
        if h is None:
            return out
        nv = self.nv
        out["ecc_uncorrected_volatile"] = self._call(
            nv.nvmlDeviceGetTotalEccErrors,
            h,
            nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            nv.NVML_VOLATILE_ECC,
        )
        out["ecc_uncorrected_aggregate"] = self._call(
            nv.nvmlDeviceGetTotalEccErrors,
            h,
            nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            nv.NVML_AGGREGATE_ECC,
        )
        rows = self._call(nv.nvmlDeviceGetRemappedRows, h)
        if rows is not None:
            corr, unc, pending, failure = rows
            out["remapped_rows"] = {
                "correctable": corr,
                "uncorrectable": unc,
                "pending": bool(pending),
                "failure": bool(failure),
            }
        return out

    def shape(self, i: int) -> "dict[str, Any]":
        """The node-shape facts of GPU i (each None where NVML cannot tell): name, pci (the
        ``domain:bus:device.function`` address), link_gen/width now and max_link_gen/width
        (what device and slot allow), nvlinks (links the GPU has) and nvlinks_active,
        ecc_mode/ecc_pending, persistence, mig/mig_pending (bools)."""
        out: dict[str, Any] = dict.fromkeys(
            (
                "name",
                "pci",
                "link_gen",
                "link_width",
                "max_link_gen",
                "max_link_width",
                "nvlinks",
                "nvlinks_active",
                "ecc_mode",
                "ecc_pending",
                "persistence",
                "mig",
                "mig_pending",
            )
        )
        h = self.handles.get(i)
        if h is None:
            return out
        nv = self.nv
        out["name"] = _text(self._call(nv.nvmlDeviceGetName, h))
        out["pci"] = self.pci_address(i)
        gen, width, max_gen, max_width = self.pcie(i)
        out.update(link_gen=gen, link_width=width, max_link_gen=max_gen, max_link_width=max_width)
        out["nvlinks"], out["nvlinks_active"] = self.nvlinks(i)
        ecc = self._call(nv.nvmlDeviceGetEccMode, h)
        if ecc is not None:
            out["ecc_mode"], out["ecc_pending"] = bool(ecc[0]), bool(ecc[1])
        persistence = self._call(nv.nvmlDeviceGetPersistenceMode, h)
        out["persistence"] = None if persistence is None else bool(persistence)
        mig = self._call(nv.nvmlDeviceGetMigMode, h)
        if mig is not None:
            out["mig"], out["mig_pending"] = bool(mig[0]), bool(mig[1])
        return out

    def pci_address(self, i: int) -> "str | None":
        """GPU i's PCI address as sysfs spells it (``0000:3b:00.0``), or None."""
        h = self.handles.get(i)
        info = self._call(self.nv.nvmlDeviceGetPciInfo, h) if h is not None else None
        bus_id = _text(getattr(info, "busId", None)) if info is not None else None
        if not bus_id:
            return None
        from .nodehealth import pci_key

        function = bus_id.rsplit(".", 1)[1] if "." in bus_id else "0"
        return f"{pci_key(bus_id)}.{function}"

    def nvlinks(self, i: int) -> "tuple[int | None, int | None]":
        """(links NVML reports, links active) of GPU i; (None, None) without NVLink."""
        h = self.handles.get(i)
        if h is None:
            return None, None
        present = active = 0
        for link in range(int(getattr(self.nv, "NVML_NVLINK_MAX_LINKS", 18))):
            state = self._call(self.nv.nvmlDeviceGetNvLinkState, h, link)
            if state is None:
                continue  # no such link (INVALID_ARGUMENT) or no NVLink at all (NOT_SUPPORTED)
            present += 1
            active += 1 if state else 0
        return (present, active) if present else (None, None)

    def link_errors(self, i: int) -> "dict[str, int | None]":
        """GPU i's link error counters, each None where NVML cannot tell: NVLink ``replay``,
        ``recovery``, ``crc_flit`` and ``crc_data`` summed over its links, and ``pcie_replay``.
        They only grow (until a reset or a reboot): a run compares two readings."""
        out: dict[str, int | None] = dict.fromkeys(LINK_ERRORS)
        h = self.handles.get(i)
        if h is None:
            return out
        nv = self.nv
        out["pcie_replay"] = self._call(nv.nvmlDeviceGetPcieReplayCounter, h)
        present, _ = self.nvlinks(i)
        for kind, code in NVLINK_ERRORS.items():
            total = None
            for link in range(present or 0):
                v = self._call(nv.nvmlDeviceGetNvLinkErrorCounter, h, link, code)
                if isinstance(v, int):
                    total = (total or 0) + v
            out[kind] = total
        return out

    def sample(self, i: int) -> "dict[str, Any]":
        """One reading of GPU i for a trace: power_w, sm_clock_mhz, temp_c, throttle (the clock
        event reasons' bit mask); each None when unreadable."""
        h = self.handles.get(i)
        out: dict[str, Any] = dict.fromkeys(("power_w", "sm_clock_mhz", "temp_c", "throttle"))
        if h is None:
            return out
        nv = self.nv
        mw = self._call(nv.nvmlDeviceGetPowerUsage, h)
        out["power_w"] = None if mw is None else round(mw / 1000.0, 1)
        out["sm_clock_mhz"] = self._call(nv.nvmlDeviceGetClockInfo, h, CLOCK_SM)
        out["temp_c"] = self._call(nv.nvmlDeviceGetTemperature, h, TEMPERATURE_GPU)
        read = (
            getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
            or nv.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        mask = self._call(read, h)
        out["throttle"] = None if mask is None else int(mask)
        return out

    def retired_pending(self, i: int) -> "bool | None":
        """Whether GPU i has retired pages waiting for a reset (pre-Ampere ECC), or None."""
        h = self.handles.get(i)
        v = self._call(self.nv.nvmlDeviceGetRetiredPagesPendingStatus, h) if h is not None else None
        return None if v is None else bool(v)

    def close(self) -> None:
        self.stop_throttle_watch()
        if self.nv is not None:
            if self.events is not None:
                self._call(self.nv.nvmlEventSetFree, self.events)
            self._call(self.nv.nvmlShutdown)


def _text(value: Any) -> "str | None":
    if isinstance(value, bytes):
        return value.decode()
    return None if value is None else str(value)
