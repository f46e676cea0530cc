"""What this machine computes natively: the dtype `hf-dflash demo`, `bench` and `train` use by default; the attention
kernels the decoding loop may use on it; where a model computes."""

import contextlib
import functools
import platform
from pathlib import Path

import torch

# torch's own checks of the CPU features that decide its matmul kernels (bfloat16 natively: AVX512-BF16 or AMX)
_CPU_FEATURES = {"avx2": "_is_avx2_supported", "avx512": "_is_avx512_supported",
                 "avx512_bf16": "_is_avx512_bf16_supported", "amx": "_is_amx_tile_supported"}


def native_bf16(device: str | torch.device | None = None) -> bool:
    """Whether `device` (default: CUDA if present, else the CPU) computes bfloat16 natively: a CUDA GPU with bf16, or a
    CPU with AVX512-BF16 or AMX. There a bfloat16 forward over 8-16 tokens costs little more than over one (as on a
    GPU), so DFlash's blocks are cheap to verify; elsewhere bfloat16 is emulated and slower than float32."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type != "cpu":
        return False
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


@functools.cache  # read per `generate` call with "auto" (its cost curve's cache key); the CPU never changes
def cpu_description() -> str:
    """The CPU's model name and the features torch's kernels use, e.g. "AMD EPYC (avx2, avx512, avx512_bf16)": two CPUs
    that a kernel version or `platform` cannot tell apart may differ much in speed and in what bfloat16 costs."""
    name = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    features = [f for f, check in _CPU_FEATURES.items() if getattr(torch.cpu, check, lambda: False)()]
    return f"{name} ({', '.join(features) or 'no vector features known'})"


def execution_device(model: torch.nn.Module) -> torch.device:
    """Where `model` computes: its parameters' device, or, for a model whose weights accelerate offloads (meta
    placeholders between forwards: a `device_map` with "cpu" / "disk" entries, `cpu_offload`), its hooks' execution
    device."""
    device = model.device
    if device.type != "meta":
        return device
    for module in model.modules():
        hook = getattr(module, "_hf_hook", None)
        for each in getattr(hook, "hooks", None) or [hook]:  # a SequentialHook holds several
            found = getattr(each, "execution_device", None)
            if found is not None:
                return torch.device(found)
    return device


def resolve_dtype(name: str, device=None) -> torch.dtype:
    """`"auto"`: bfloat16 where `native_bf16`, else float32; otherwise the torch dtype of that name."""
    if name == "auto":
        return torch.bfloat16 if native_bf16(device) else torch.float32
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtype {name!r}: use auto, float32, bfloat16, float16 or float64.")
    return dtype


@contextlib.contextmanager
def without_cudnn_attention(device):
    """Inside: `scaled_dot_product_attention` without its cuDNN backend where `device` is CUDA (else: nothing changes);
    restored on leaving, whatever the user had set.

    On Hopper, cuDNN may be picked for bfloat16 attention without a mask or with a boolean one, and it builds a graph
    for every new pair of query and key lengths, which costs far more than the attention itself. Decoding meets a new
    key length at every step, in the target's verification and in the drafter's forward (docs/design.md)."""
    if torch.device(device).type != "cuda" or not torch.backends.cuda.cudnn_sdp_enabled():
        yield
        return
    torch.backends.cuda.enable_cudnn_sdp(False)
    try:
        yield
    finally:
        torch.backends.cuda.enable_cudnn_sdp(True)
