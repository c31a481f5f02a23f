"""A vision tower on another device than its language model (the card's `vision_device`): accelerate's hooks.

transformers' `generate` moves the forward's inputs to `model.device` right before each call
(`prepare_inputs_for_generation`, transformers 5.23), and `model.device` is the device of the model's
first parameter: for most families the tower's. With the language model elsewhere, its first layer
then meets inputs on the tower's device (found on an H100: ten families failed with the language model
on the CPU and the tower on `cuda:0`; LLaVA-NeXT and LLaVA-OneVision worked only because their first
parameter, `image_newline`, stays with the language model).

Changing what `model.device` says would change what the families' own code does with it (Idefics3,
SmolVLM and InternVL cast the pixels to `model.dtype`, the tower's). So, as accelerate's `dispatch_model`
does for a model split over devices, an `AlignDevicesHook` on the whole model moves its forward's inputs
to the language model's device (the outputs back where the inputs came from; the KV cache is left where
it is), and one on each vision part moves that part's inputs to the tower's device and its outputs back.
One more on the language model itself (`get_decoder()`) moves its inputs to its device: transformers
5.23's Idefics3 moves each decoding step's embeddings to `self.device`, the tower's (an H200 run failed
there with the language model on the CPU; SmolVLM's copy of that code uses the ids' device).
"""
from __future__ import annotations

import torch
from accelerate.hooks import AlignDevicesHook, SequentialHook, add_hook_to_module, remove_hook_from_module


class SplitDevicesHook(AlignDevicesHook):
    """accelerate's hook, under a name of its own: the ones placed here are told apart from any other."""


def align_devices(model: torch.nn.Module, parts: list[torch.nn.Module], lm_device: torch.device,
                  vision_device: torch.device) -> bool:
    """Hook `model` and its vision `parts` for their devices; drop the hooks placed here before, and place
    none where both devices are the same. Returns whether hooks are in place."""
    decoder = language_model(model, parts)
    for module in (model, *parts, *decoder):
        drop_ours(module)
    if torch.device(lm_device) == torch.device(vision_device):
        return False
    # `append`: a model dispatched by accelerate (loaded with a device_map) keeps its own hooks first.
    skip_keys = getattr(model, "_skip_keys_device_placement", None)
    add_hook_to_module(model, SplitDevicesHook(execution_device=lm_device, io_same_device=True,
                                               skip_keys=skip_keys), append=True)
    for module in decoder:  # its outputs stay on its device, where the head that reads them is
        add_hook_to_module(module, SplitDevicesHook(execution_device=lm_device, skip_keys=skip_keys), append=True)
    for part in parts:
        add_hook_to_module(part, SplitDevicesHook(execution_device=vision_device, io_same_device=True), append=True)
    return True


def language_model(model: torch.nn.Module, parts: list[torch.nn.Module]) -> list[torch.nn.Module]:
    """The model's language model (`get_decoder()`), in a list; none where it has none or it is a vision part."""
    get_decoder = getattr(model, "get_decoder", None)
    decoder = get_decoder() if callable(get_decoder) else None
    if not isinstance(decoder, torch.nn.Module) or decoder is model or any(decoder is part for part in parts):
        return []
    return [decoder]


def drop_ours(module: torch.nn.Module) -> None:
    """The module's forward without the hooks placed here; any other hook stays, unwrapped where it is
    left alone (else each new pipeline for the model would nest the chain one level deeper)."""
    hook = getattr(module, "_hf_hook", None)
    if isinstance(hook, SplitDevicesHook):
        remove_hook_from_module(module)
    elif isinstance(hook, SequentialHook):
        rest = [h for h in hook.hooks if not isinstance(h, SplitDevicesHook)]
        # accelerate's wrapped forward reads `_hf_hook` at each call: replacing it is enough.
        module._hf_hook = rest[0] if len(rest) == 1 else SequentialHook(*rest)
