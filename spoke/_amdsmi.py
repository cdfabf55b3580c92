"""AMD backend: reads GPUs through AMD SMI (the ``amdsmi`` module shipped with ROCm).

As with NVML, the module is a constructor argument; ``load_amdsmi`` is the only place that
imports the real one. amdsmi reports VRAM in MB (bytes >> 20, so MiB) and power in W, which
is what device-metrics-exporter publishes; only temperatures need care (see ``_celsius``).
"""

from __future__ import annotations

import contextlib
import io
import logging
from typing import Any

from spoke._model import Collection, Failure, GpuReading, LibraryNotFound

log = logging.getLogger(__name__)

# AMDSMI_STATUS_* values (amdsmi_wrapper) meaning "this device does not report that value":
# NOT_SUPPORTED, NOT_YET_IMPLEMENTED, NO_PERM, NO_DATA. They are part of the C ABI, stable
# across releases, and amdsmi's Python package does not re-export them under one name.
_ABSENT_CODES = frozenset({2, 3, 10, 40})
_NA = "N/A"  # what amdsmi's Python layer returns for fields the firmware leaves unset


def load_amdsmi() -> Any:
    """Import amdsmi; where ROCm's libamd_smi.so is absent the import itself fails."""
    try:
        # amdsmi prints its own complaint to stdout before failing; keep our output clean.
        with contextlib.redirect_stdout(io.StringIO()):
            import amdsmi
    except Exception:  # ImportError, OSError, KeyError: all mean "no usable library"
        raise LibraryNotFound("AMD SMI library not found") from None
    return amdsmi


def _celsius(raw: float) -> float:
    """The one place temperature units are decided.

    amdsmi_get_temp_metric returns degrees Celsius in current releases, but the rocm_smi-based
    releases it replaced (and some early amdsmi builds) returned millidegrees. No GPU sensor
    reads 1000 °C, so a magnitude that large can only be millidegrees.
    """
    return raw / 1000.0 if abs(raw) >= 1000 else float(raw)


def _number(value: Any) -> float | None:
    """amdsmi mixes ints, numeric strings and "N/A"; only real numbers become samples."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return float(str(value).strip())
    except ValueError:
        return None


def _text(value: Any) -> str:
    text = "" if value is None else str(value).strip()
    return "" if text == _NA else text


class AmdSmiBackend:
    """Reads every GPU AMD SMI enumerates; a GPU that errors is reported, not fatal."""

    name = "amdsmi"
    vendor = "amd"

    def __init__(self, amdsmi: Any) -> None:
        self._amdsmi = amdsmi

    def open(self) -> None:
        a = self._amdsmi
        try:
            a.amdsmi_init(a.AmdSmiInitFlags.INIT_AMD_GPUS)
        except a.AmdSmiException as exc:
            raise LibraryNotFound(f"AMD SMI library not usable: {_one_line(exc)}") from None

    def close(self) -> None:
        a = self._amdsmi
        try:
            a.amdsmi_shut_down()
        except a.AmdSmiException as exc:
            log.debug("ignored AMD SMI error in shutdown: %s", _one_line(exc))

    def collect(self) -> Collection:
        a = self._amdsmi
        handles = a.amdsmi_get_processor_handles()  # an error here fails the whole pass
        readings: list[GpuReading] = []
        failures: list[Failure] = []
        for index, handle in enumerate(handles):
            try:
                readings.append(self._read_gpu(index, handle))
            except a.AmdSmiException as exc:
                failures.append(Failure(index, f"GPU {index}: {_one_line(exc)}"))
        return Collection(tuple(readings), tuple(failures), len(handles))

    def _opt(self, fn: Any, *args: Any) -> Any:
        """Call AMD SMI; None when the device does not support it, raise when it failed."""
        a = self._amdsmi
        try:
            return fn(*args)
        except a.AmdSmiLibraryException as exc:
            if getattr(exc, "err_code", None) in _ABSENT_CODES:
                return None
            raise

    def _temperature(self, handle: Any, sensor: Any) -> float | None:
        a = self._amdsmi
        raw = _number(self._opt(a.amdsmi_get_temp_metric, handle, sensor,
                                a.AmdSmiTemperatureMetric.CURRENT))
        return _celsius(raw) if raw is not None else None

    def _read_gpu(self, index: int, handle: Any) -> GpuReading:
        a = self._amdsmi
        uuid = _text(a.amdsmi_get_gpu_device_uuid(handle))
        asic = self._opt(a.amdsmi_get_gpu_asic_info, handle) or {}
        board = self._opt(a.amdsmi_get_gpu_board_info, handle) or {}
        driver = self._opt(a.amdsmi_get_gpu_driver_info, handle) or {}
        activity = self._opt(a.amdsmi_get_gpu_activity, handle) or {}
        vram = self._opt(a.amdsmi_get_gpu_vram_usage, handle) or {}
        power = self._opt(a.amdsmi_get_power_info, handle) or {}
        ecc = self._opt(a.amdsmi_get_gpu_total_ecc_count, handle) or {}
        bdf = _text(self._opt(a.amdsmi_get_gpu_device_bdf, handle))
        total = _number(vram.get("vram_total"))
        used = _number(vram.get("vram_used"))
        # amdsmi 6.1+ fills socket_power; earlier releases only one of current_/average_
        # (MI300 the former, MI200 the latter), the other being "N/A".
        watts = next((w for key in ("socket_power", "current_socket_power",
                                    "average_socket_power")
                      if (w := _number(power.get(key))) is not None), None)
        return GpuReading(
            index=index,
            uuid=uuid,
            model=_text(asic.get("market_name")) or _text(board.get("product_name")),
            driver_version=_text(driver.get("driver_version")),
            pci_bus_id=bdf,
            serial=_text(board.get("product_serial")),
            board_model=_text(board.get("model_number")),
            util_pct=_number(activity.get("gfx_activity")),
            mem_copy_util_pct=_number(activity.get("umc_activity")),
            ecc_sbe_volatile=_number(ecc.get("correctable_count")),
            ecc_dbe_volatile=_number(ecc.get("uncorrectable_count")),
            # AMD's device plugin names GPUs by PCI address; accept the UUID as well
            device_ids=tuple(d for d in (uuid, bdf) if d),
            mem_used_mib=used,
            mem_total_mib=total,
            mem_free_mib=total - used if total is not None and used is not None else None,
            power_w=watts,
            temp_c=self._temperature(handle, a.AmdSmiTemperatureType.EDGE),
            junction_temp_c=self._temperature(handle, a.AmdSmiTemperatureType.HOTSPOT),
        )


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())
