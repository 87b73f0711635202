"""The roofline: whether a pass is bound by the device's arithmetic or by its memory, and the time floor that
follows from its flops and bytes.

A pass of F flops moving B bytes takes at least max(F / peak, B / bandwidth). Its arithmetic intensity F / B
against the device's ridge (peak / bandwidth) says which term wins: below the ridge the figure of merit is
bandwidth (GB/s against the copy ceiling), above it tensor-core throughput. The peak depends on how the
products run: 16-bit operands on the tensor cores, float32 operators in IEEE float32 on the CUDA cores
(`codegen/emit_gemm.py`), pointwise work on the CUDA cores in float32.
"""

from __future__ import annotations

from dataclasses import dataclass

from opforge.i18n import N_, _


@dataclass(frozen=True)
class Device:
    name: str
    bandwidth: float  # bytes/s: the device-to-device copy ceiling measured on it (bytes read plus written)
    bandwidth_source: str
    peak: dict  # operator dtype -> dense flops/s of its products, from the vendor's datasheet
    peak_source: str


H200 = Device(
    "NVIDIA H200 (SXM, 132 SMs)",
    4245e9, N_("copy ceiling measured on an H200, docs/benchmarks/2026-12-04-nvidia-h200.md"),
    {"bfloat16": 989.5e12, "float16": 989.5e12, "float32": 66.9e12},
    N_("NVIDIA H200 datasheet: dense BF16/FP16 tensor core, FP32 (CUDA cores)"))


def ridge(device: Device, dtype: str) -> float:
    """Flops per byte above which a pass is compute-bound on the device."""
    return device.peak[dtype] / device.bandwidth


def classify(flops: int, nbytes: int, dtype: str, device: Device = H200) -> dict:
    """Intensity, the device's ridge, which bound applies and the time floor in microseconds."""
    intensity = flops / max(1, nbytes)
    r = ridge(device, dtype)
    floor = max(flops / device.peak[dtype], nbytes / device.bandwidth)
    return {"intensity": round(intensity, 3), "ridge": round(r, 1), "bound": "compute" if intensity > r else "memory",
            "floor_us": round(floor * 1e6, 3)}


def describe(device: Device = H200) -> str:
    """One paragraph for a report, in the current language: the device, its ridges and where the figures come
    from."""
    ridges = ", ".join(f"{d} {ridge(device, d):.0f}" for d in ("bfloat16", "float32"))
    return _("Roofline on the {device}: bandwidth {bandwidth:.0f} GB/s ({bandwidth_source}); peak flops from the "
             "{peak_source}; ridge (flops/byte) {ridges}. A pass below the ridge is memory-bound and judged by its "
             "bytes against the copy ceiling, one above it by its flops against the peak; the floor is "
             "max(flops / peak, bytes / bandwidth).").format(
        device=device.name, bandwidth=device.bandwidth / 1e9, bandwidth_source=_(device.bandwidth_source),
        peak_source=_(device.peak_source), ridges=ridges)
