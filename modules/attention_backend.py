"""Which attention kernels the local model runs on CUDA: cuDNN's backend off, unless --cudnn-attention.

torch runs `scaled_dot_product_attention` through cuDNN first on Hopper and Blackwell GPUs (with cuDNN
newer than 9.15). cuDNN builds an execution plan for each shape it meets, and keeps it for the thread
that met it. A chat meets new shapes all the time: each turn's prefill has a new length, and each eager
decoding step attends over one more token than the step before. So every step of a new reply can wait
for a plan. On an H200 (torch 2.11, LLaVA-1.5-7B's shapes, bf16), a chat's first replies decoded at
13-16 tokens/s and the same reply asked again at 40. Under the profiler, 47 ms of one turn's 101 ms
prefill went into `aten::_cudnn_attention_forward` on the host. FlashAttention-2, torch's next choice,
builds no plans. `bench/decode.py --attention-backends` measures the three cases side by side.
"""
from __future__ import annotations

import torch

from modules import shared
from modules.logging_colors import logger


def choose(on_cuda: bool) -> None:
    """Sets torch's process-wide switch for cuDNN's attention before the model runs; without CUDA,
    leaves it as it is."""
    if not on_cuda:
        return
    keep = bool(getattr(shared.args, "cudnn_attention", False))
    torch.backends.cuda.enable_cudnn_sdp(keep)
    if not keep:
        logger.info("Attention: cuDNN's backend is off (it plans each new sequence length again, a wait at "
                    "every decoding step of a new reply); --cudnn-attention keeps it")
