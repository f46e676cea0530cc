"""What a hybrid target's verification pays to be rolled back per row (docs/design.md, "Hybrid targets").

On a random-weight target of a named shape (`hf_dflash.bench.random_models.RANDOM_SHAPES`, e.g. qwen3.5-0.8b), after
a `--context`-token prompt, per block of T tokens: the target's forward over the block as transformers runs a chunk
(no states recorded), the same forward recording the recurrent state after each token (`record_block`, what the
loop runs), the per-row rollback (`keep_states`, rows keeping different lengths) and, for scale, a one-token decode
step. Medians of `--repeats` rounds, the sizes taking turns.

    python examples/hybrid_rollback_cost.py --shape qwen3.5-0.8b --dtype bfloat16 --blocks 8 16 --threads 1
"""

import argparse
import json
import statistics
import time

import torch
from tqdm import tqdm

from hf_dflash.bench.random_models import build_random_models
from hf_dflash.generation.linear_attention import keep_states, linear_layers, new_cache, record_block


def forward(target, cache, ids, start: int):
    positions = torch.arange(start, start + ids.shape[1]).expand(ids.shape[0], -1)
    return target(input_ids=ids, position_ids=positions, cache=cache, use_cache=True, output_hidden_states=True)


def snapshot(cache) -> list:
    """The linear layers' states and the attention layers' lengths, to restore after a timed forward."""
    return [(layer, dict(layer.conv_states), {i: s.clone() for i, s in layer.recurrent_states.items()})
            for layer in linear_layers(cache)]


def restore(cache, saved, length: int) -> None:
    for layer, conv, recurrent in saved:
        layer.conv_states.update(conv)
        for i, state in recurrent.items():
            layer.recurrent_states[i].copy_(state)
        layer.recurrent_states_history = {i: [] for i in range(layer.number_of_states)}
        layer.cumulative_length_linear.fill_(length)
    for layer in cache.layers:
        if getattr(layer, "keys", None) is not None:
            layer.keys, layer.values = layer.keys[..., :length, :], layer.values[..., :length, :]


@torch.inference_mode()
def measure(args) -> dict:
    target, _ = build_random_models(args.shape, "cpu", getattr(torch, args.dtype))
    vocab = target.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1, vocab - 1, (args.batch, args.context + max(args.blocks)), generator=generator)
    cache = new_cache(target)
    forward(target, cache, ids[:, : args.context], 0)
    keep_states(cache, args.context)
    saved = snapshot(cache)
    runs = {}
    for _ in tqdm(range(args.repeats + 1), desc=f"{args.shape} {args.dtype}", unit="round"):
        for block in [1, *args.blocks]:
            new = ids[:, args.context : args.context + block]
            for recorded in (False, True) if block > 1 else (False,):
                record_block(cache, block if recorded else 0)
                began = time.perf_counter()
                forward(target, cache, new, args.context)
                elapsed = time.perf_counter() - began
                runs.setdefault(f"forward_{block}_{'recorded' if recorded else 'chunked'}", []).append(elapsed)
                if recorded:
                    kept = torch.randint(1, block + 1, (args.batch,), generator=generator)
                    began = time.perf_counter()
                    keep_states(cache, block, kept)
                    runs.setdefault(f"rollback_{block}", []).append(time.perf_counter() - began)
                restore(cache, saved, args.context)
    return {name: 1000 * statistics.median(times[1:]) for name, times in runs.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="qwen3.5-0.8b")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--blocks", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--output", help="a JSON file for the milliseconds")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ms = measure(args)
    print(f"{args.shape}, {args.dtype}, batch {args.batch}, {args.context}-token context, {args.threads} thread(s): ms")
    print("| block | one-token step | forward, chunked | forward, recorded | rollback | overhead |")
    print("|---|---|---|---|---|---|")
    for block in args.blocks:
        chunked, recorded, rollback = (ms[f"{k}_{block}" + s] for k, s in
                                       (("forward", "_chunked"), ("forward", "_recorded"), ("rollback", "")))
        print(f"| {block} | {ms['forward_1_chunked']:.1f} | {chunked:.1f} | {recorded:.1f} | {rollback:.2f} | "
              f"{(recorded + rollback) / chunked - 1:+.1%} |")
    if args.output:
        with open(args.output, "w") as f:
            json.dump({"args": vars(args), "ms": ms}, f, indent=1)


if __name__ == "__main__":
    main()
