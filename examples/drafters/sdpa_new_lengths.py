"""Does attention on this GPU pay for every new key length? (It did: cuDNN, ~60 ms a length on an H200.)

bfloat16 `scaled_dot_product_attention` with Qwen3-8B's heads (32 x 128), 1 or 16 queries, no mask / a boolean mask
/ a float mask, over 40 key lengths never seen before in the process, each call timed alone (synchronized): with
torch's default backends, and with cuDNN excluded. Decoding meets a new key length at every step, so "median
new-shape" is what each attention call of a decoding step costs. `choice`: the backend the default flags pick (taken
outside the sweep's context). Output of the H200 run: oracle-cuda-h200/sdpa_new_lengths.log.

    python3 examples/drafters/sdpa_new_lengths.py          # DEV=cpu runs it on a CPU (no cuDNN there)
"""

import contextlib
import os
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

dev = os.environ.get("DEV", "cuda")
sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
names = {int(b): n for n, b in SDPBackend.__members__.items()}


def case(q_len, kv_len, mask_kind):
    q = torch.randn(1, 32, q_len, 128, device=dev, dtype=torch.bfloat16)
    k = torch.randn(1, 32, kv_len, 128, device=dev, dtype=torch.bfloat16)
    mask = None
    if mask_kind == "bool":
        mask = torch.ones(1, 1, q_len, kv_len, device=dev, dtype=torch.bool).tril(kv_len - q_len)
    elif mask_kind == "float":
        mask = torch.zeros(1, 1, q_len, kv_len, device=dev, dtype=torch.bfloat16)
    return q, k, k, mask


def sweep(label, lengths, q_len, mask_kind, ctx=contextlib.nullcontext):
    times = []
    for kv in lengths:
        q, k, v, m = case(q_len, kv, mask_kind)
        sync()
        began = time.perf_counter()
        with ctx():
            F.scaled_dot_product_attention(q, k, v, attn_mask=m)
        sync()
        times.append((time.perf_counter() - began) * 1e3)
    choice = names.get(torch._fused_sdp_choice(*case(q_len, lengths[0], mask_kind)), "?")
    print(f"{label:28s} q={q_len:2d} mask={mask_kind:5s} choice={choice:20s} first={times[0]:8.2f} ms  "
          f"median new-shape={sorted(times[1:])[len(times) // 2]:7.2f} ms  max={max(times):7.2f}")


if __name__ == "__main__":
    print(torch.__version__, "cudnn", torch.backends.cudnn.version(), "cudnn_sdp", torch.backends.cuda.cudnn_sdp_enabled())
    no_cudnn = lambda: sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])
    for mask_kind in ["none", "bool", "float"]:
        for q_len in [1, 16]:
            sweep("default", list(range(300 + 40 * q_len, 340 + 40 * q_len)), q_len, mask_kind)
            sweep("cuDNN excluded", list(range(1300 + 40 * q_len, 1340 + 40 * q_len)), q_len, mask_kind, no_cudnn)
    for _ in range(2):  # the same lengths twice: the second sweep meets none new
        sweep("default, repeated shapes", list(range(940, 980)), 16, "float")
