"""Evaluating a drafter while it trains: its real acceptance length with `generate` on held-out prompts."""

import torch

from ..prompts import chat_inputs, read_prompts


@torch.no_grad()
def acceptance_on_prompts(target, drafter, tokenizer, prompts, max_new_tokens: int = 64, limit: int = 8) -> dict:
    """Greedy acceptance length (tokens committed per target forward, pooled over all steps) on chat prompts: a
    list of `Prompt`s or a prompt file (`hf_dflash.prompts.read_prompts`)."""
    if isinstance(prompts, str):
        prompts = list(read_prompts(prompts, limit=limit))
    committed = steps = 0
    for prompt in prompts[:limit]:
        out = target.generate(
            **chat_inputs(tokenizer, prompt.messages, target.device), assistant_model=drafter,
            max_new_tokens=max_new_tokens, do_sample=False, return_dict_in_generate=True,
        )
        committed += sum(out.acceptance_lengths[0])
        steps += len(out.acceptance_lengths[0])
    return {"prompts": min(len(prompts), limit), "acceptance_length": committed / max(steps, 1)}
