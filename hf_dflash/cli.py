"""The `hf-dflash` command (also `python -m hf_dflash`): a thin layer of argument parsing over the Python API.

    hf-dflash demo                       # speculative decoding on the packaged SmolLM2-135M-Instruct
    hf-dflash prepare-data --target ID --prompts prompts.jsonl --output data.jsonl
    hf-dflash store-features --target ID --data data.jsonl --output store   # rebuild a lost feature store
    hf-dflash train --target ID --data data.jsonl --output my-drafter --num-layers 2 --block-size 8
    hf-dflash bench --drafter my-drafter --sets gsm8k mbpp alpaca --num-prompts 8 --output-dir bench_out
"""

import argparse
import dataclasses
import json
import sys
import time
import typing
from pathlib import Path

from .bench import BASELINES, DEFAULT_BASELINES, RANDOM_SHAPES
from .bigram import DEFAULTS as BIGRAM_DEFAULTS
from .packaged import SMOLLM2_ID, load_target

# Written for the demo: none is in the shipped drafter's training data (GSM8K train, ShareGPT) or a benchmark set.
DEMO_PROMPTS = [
    "A bakery sells muffins for 3 dollars each. On Monday it sold 24 muffins, and on Tuesday it sold twice as many. "
    "How much money did the bakery make on the two days?",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Give three tips for staying healthy.",
]
_SHIPPED = "smollm2-135m-instruct-dflash"
VLLM_PYTHON_HELP = "a vLLM virtualenv's python (default: $HF_DFLASH_VLLM_PYTHON; examples/make_vllm_env.sh builds one)"
# In a wheel, examples/drafters is installed as hf_dflash/drafters (pyproject.toml); in a checkout it stays in place.
_HERE = Path(__file__).resolve().parent
SHIPPED_DRAFTER = next(
    (d for d in (_HERE / "drafters" / _SHIPPED, _HERE.parent / "examples" / "drafters" / _SHIPPED)
     if (d / "config.json").is_file()),
    None,
)


def _demo_drafter(args, target, tokenizer):
    """The demo's drafter (`--drafter`, else the shipped one beside SmolLM2, else an untrained one, said loudly), in
    `--drafter-dtype`; prints what runs."""
    import torch
    from transformers import AutoModel

    import hf_dflash

    from .devices import resolve_dtype

    drafter_dtype = resolve_dtype(args.drafter_dtype)
    if args.drafter:
        drafter, trained = AutoModel.from_pretrained(args.drafter, dtype=drafter_dtype), True
    elif SHIPPED_DRAFTER is not None and args.target == SMOLLM2_ID:
        drafter, trained = AutoModel.from_pretrained(str(SHIPPED_DRAFTER), dtype=drafter_dtype), True
    else:
        torch.manual_seed(0)
        drafter = hf_dflash.DFlashDraftModel.from_target(target, 1, args.block_size, tokenizer=tokenizer)
        trained = False
    drafter.to(drafter_dtype).eval()
    print(f"target: {args.target} | drafter: {args.drafter or ('shipped' if trained else 'untrained, random')} "
          f"| block size {drafter.block_size} | draft tree {drafter.draft_tree_size or 'none (chain)'} | confidence "
          f"threshold {drafter.assistant_confidence_threshold} | {str(target.dtype).replace('torch.', '')} (drafter "
          f"{str(drafter.dtype).replace('torch.', '')}) "
          f"| torch threads {args.threads}")
    if not trained:
        print("NOTE: this drafter is UNTRAINED (random weights): it shows the API and that the output is exactly the "
              "target's, but it accepts almost no drafts, so it is slower than plain generate. Train one with "
              "`hf-dflash train`.")
    return drafter


def demo(args) -> int:
    import torch

    from .bench.run import first_difference
    from .bench.static import dflash_static_timer, plain_static_timer
    from .prompts import chat_inputs

    torch.set_num_threads(args.threads)
    target, tokenizer = load_target(args.target, args.dtype)
    exact = target.dtype in (torch.float32, torch.float64)
    drafter = _demo_drafter(args, target, tokenizer)
    # Untimed warm-up of both paths: first calls allocate, and draft_tree_size="auto" measures the target's forward
    # costs once (a few seconds, then cached on disk).
    warm = chat_inputs(tokenizer, [{"role": "user", "content": "Hi"}])
    target.generate(**warm, max_new_tokens=8, do_sample=False)
    target.generate(**warm, max_new_tokens=8, do_sample=False, assistant_model=drafter)
    total_plain = total_fast = total_static = total_fast_static = 0.0
    committed = steps = 0
    static = plain_static_timer(target, args.max_new_tokens) if args.compile else None
    fast_static = dflash_static_timer(target, drafter, args.max_new_tokens) if args.compile else None
    if args.compile:
        print("--compile: plain generate and DFlash each also run with a static cache, compiled; the first call of a "
              "new cache length compiles, untimed (DFlash: every verification width, a minute or more on a CPU)")
    for prompt in DEMO_PROMPTS[: args.num_prompts]:
        inputs = chat_inputs(tokenizer, [{"role": "user", "content": prompt}])
        start = time.perf_counter()
        plain = target.generate(**inputs, max_new_tokens=args.max_new_tokens, do_sample=False)
        total_plain += time.perf_counter() - start
        if static is not None:
            seconds, same_as_plain = static(inputs, plain)
            total_static += seconds
            if not same_as_plain and exact:
                print("ERROR: plain generate with a static cache differs from plain generate", file=sys.stderr)
                return 1
        start = time.perf_counter()
        out = target.generate(
            **inputs, max_new_tokens=args.max_new_tokens, do_sample=False, assistant_model=drafter,
            return_dict_in_generate=True,
        )
        total_fast += time.perf_counter() - start
        accepted = out.acceptance_lengths[0]
        committed, steps = committed + sum(accepted), steps + len(accepted)
        answer = tokenizer.decode(out.sequences[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
        same, start = torch.equal(plain, out.sequences), inputs["input_ids"].shape[1]
        where = first_difference(plain[0, start:].tolist(), out.sequences[0, start:].tolist())
        note = "" if same or exact else (
            f" (first difference at new token {where}:"
            " in bfloat16 a block forward may round a near-tie differently from one-token forwards; float32 is exact)")
        print(f"\n> {prompt}\n{answer.strip()}\n[acceptance length {sum(accepted) / max(len(accepted), 1):.2f} "
              f"over {len(accepted)} target forwards; identical to plain generate: {same}{note}]")
        if not same and exact:
            print("ERROR: output differs from plain greedy generate", file=sys.stderr)
            return 1
        if fast_static is not None:
            seconds, out = fast_static(inputs)
            total_fast_static += seconds
            accepted, same = out.acceptance_lengths[0], torch.equal(plain, out.sequences)
            print(f"[with a static cache, compiled: acceptance length {sum(accepted) / max(len(accepted), 1):.2f} over "
                  f"{len(accepted)} target forwards; identical to plain generate: {same}]")
            if exact and not same:
                print("ERROR: DFlash with a static cache differs from plain greedy generate", file=sys.stderr)
                return 1
    print(f"\nacceptance length (tokens per target forward): {committed / max(steps, 1):.2f}")
    print(f"time: plain generate {total_plain:.2f} s, DFlash {total_fast:.2f} s -> speedup "
          f"{total_plain / total_fast:.2f}x"
          f" (measured in this run, {args.num_prompts} prompts, {args.max_new_tokens} max new tokens)")
    if static is not None:
        best = min(total_plain, total_static)
        print(f"with a static cache, compiled: plain generate {total_static:.2f} s, DFlash {total_fast_static:.2f} s "
              f"(the fixed-shape path) -> the faster DFlash over the faster plain: "
              f"{best / min(total_fast, total_fast_static):.2f}x")
    return 0


def prepare_data_cmd(args) -> int:
    import torch

    from .prompts import read_prompts
    from .training.data import prepare_data

    torch.set_num_threads(args.threads)
    if args.engine == "vllm":
        from .engines import VLLMGenerator

        target, tokenizer = VLLMGenerator.load(args.target, args.vllm_python, args.dtype, args.threads,
                                               args.save_features)
    else:
        target, tokenizer = load_target(args.target, args.dtype)
    prompts = list(read_prompts(args.prompts, limit=args.limit))
    stats = prepare_data(
        target, tokenizer, prompts, args.output, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
        do_sample=args.temperature > 0, temperature=args.temperature or 1.0, top_p=args.top_p,
        enable_thinking=args.enable_thinking, max_prompt_tokens=args.max_prompt_tokens,
        save_features=args.save_features, target_layer_ids=args.target_layer_ids,
        num_draft_layers=args.num_draft_layers, target_topk=args.target_topk,
    )
    print(json.dumps(dataclasses.asdict(stats), indent=2))
    return 0


def store_features_cmd(args) -> int:
    import torch

    from .training.data import store_features

    torch.set_num_threads(args.threads)
    target, _ = load_target(args.target, args.dtype)
    written = store_features(
        target, args.data, args.output, target_layer_ids=args.target_layer_ids,
        num_draft_layers=args.num_draft_layers, target_topk=args.target_topk, batch_size=args.batch_size,
    )
    print(f"wrote the features of {written} samples to {args.output}")
    return 0


def train_cmd(args) -> int:
    from .training import TrainingConfig, train

    fields = {f.name for f in dataclasses.fields(TrainingConfig)}
    config = TrainingConfig(**{k: v for k, v in vars(args).items() if k in fields and v is not None})
    train(config)
    print(f"saved the drafter to {config.output}")
    return 0


def bigram_prior_cmd(args) -> int:
    import shutil
    import tempfile

    from .bigram import count_bigram_prior
    from .hub import REMOTE_CODE
    from .modeling import DFlashDraftModel
    from .modeling.modeling_dflash import EXTRAS_FILE
    from .training.data import load_samples

    drafter = DFlashDraftModel.from_pretrained(args.folder, dtype="auto")
    samples, _ = load_samples(args.data, max_length=args.max_length)
    settings = {"beta": args.beta, "mix": args.mix, "min_count": args.min_count}
    keys, boosts = count_bigram_prior(samples, drafter.config.vocab_size, drafter.draft_vocab, **settings)
    drafter.set_bigram_prior(keys, boosts, **settings)
    output = Path(args.output or args.folder)
    output.mkdir(parents=True, exist_ok=True)
    # written beside, then moved in: an interrupted run leaves the folder's drafter whole
    with tempfile.TemporaryDirectory(dir=output) as tmp:
        drafter.save_pretrained(tmp)
        for name in ("model.safetensors", EXTRAS_FILE, "config.json", *REMOTE_CODE):  # not README.md: the card stays
            if Path(tmp, name).exists():
                Path(tmp, name).chmod(0o644)
                Path(tmp, name).replace(output / name)
    if output != Path(args.folder):
        for extra in Path(args.folder).iterdir():  # the card, training record, bench files
            if not (output / extra.name).exists():
                (shutil.copytree if extra.is_dir() else shutil.copy2)(extra, output / extra.name)
    print(f"wrote a bigram prior of {keys.numel()} pairs from {len(samples)} samples into {output}")
    return 0


def card_cmd(args) -> int:
    from .hub import write_model_card

    path = write_model_card(args.folder, args.repo_id, args.results)
    print(f"wrote {path}")
    return 0


def push_cmd(args) -> int:
    from .hub import push_drafter

    uploads = push_drafter(args.folder, args.repo_id, private=args.private, token=args.token,
                           revision=args.revision, dry_run=args.dry_run)
    verb = "would upload" if args.dry_run else "uploaded"
    for name, size in uploads:
        print(f"{verb} {name} ({size / 1e6:.2f} MB)")
    if not args.dry_run:
        print(f"https://huggingface.co/{args.repo_id}")
    return 0


def _tree_size(value: str):
    """A --draft-tree-sizes value: a whole number (0: the chain) or "auto"."""
    return value if value == "auto" else int(value)


def bench_cmd(args) -> int:
    import torch
    from transformers import AutoModel

    import hf_dflash

    from .bench import benchmark, load_prompt_set, write_outputs
    from .bench.report import differences
    from .devices import resolve_dtype
    from .generation.compiling import compile_everywhere

    torch.set_num_threads(args.threads)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.random_target:
        from .bench.random_models import build_random_models, random_prompts

        block = max(args.block_sizes or [16])
        target, drafter = build_random_models(args.random_target, device, resolve_dtype(args.dtype, device),
                                              block_size=block, num_draft_layers=args.draft_layers, seed=args.seed)
        tokenizer = None
        vocab = target.config.get_text_config().vocab_size
        prompt_sets = {"random": random_prompts(args.num_prompts, args.prompt_tokens, vocab, seed=args.seed)}
        source = f"random {args.random_target}"
        note = (f"RANDOM target ({args.random_target}) and drafter ({drafter.config.num_hidden_layers} layers, block "
                f"{block}): random drafts accept almost nothing, so this measures the loop (with --oracle), not a "
                f"drafter; prompts are {args.prompt_tokens} random token ids.")
    else:
        prompt_sets = {name: load_prompt_set(name, args.num_prompts, args.bench_dir) for name in args.sets}
        target, tokenizer = load_target(args.target, args.dtype, device)
        target.to(device)
        source = args.target
        if args.drafter:
            drafter, note = AutoModel.from_pretrained(args.drafter).to(device), None
        else:
            torch.manual_seed(args.seed)
            drafter = hf_dflash.DFlashDraftModel.from_target(target, 1, 8, tokenizer=tokenizer)
            note = ("UNTRAINED drafter (random weights, 1 layer, block 8): it accepts almost no drafts, so DFlash is "
                    "slower than plain generate here; these numbers measure overhead, not a trained drafter.")
    drafter.to(resolve_dtype(args.drafter_dtype, device)).eval()
    print(f"target: {source} | drafter: {args.drafter or 'untrained, random'} | block size {drafter.block_size} "
          f"| {str(target.dtype).replace('torch.', '')} on {device} (drafter "
          f"{str(drafter.dtype).replace('torch.', '')}) | torch threads {args.threads} "
          f"| sets: {', '.join(f'{k} ({len(v)})' for k, v in prompt_sets.items())}")
    if note:
        print("NOTE: " + note)
    compile_config = compile_everywhere(device) if args.compile else None
    results = benchmark(
        target, drafter, tokenizer, prompt_sets, block_sizes=args.block_sizes, batch_sizes=args.batch_sizes,
        modes=args.modes, temperature=args.temperature, max_new_tokens=args.max_new_tokens, baselines=args.baselines,
        threads=args.threads, warmup=args.warmup, seed=args.seed, drafter_note=note,
        assistant_confidence_threshold=args.assistant_confidence_threshold, draft_tree_sizes=args.draft_tree_sizes,
        oracle=args.oracle, cache_implementation=args.cache_implementation, compile_config=compile_config,
        vllm=args.vllm_python,
    )
    results["target"], results["drafter"]["source"] = source, args.drafter or "untrained (random)"
    paths = write_outputs(results, args.output_dir, make_plot=not args.no_plot)
    print("\n" + results["markdown"])
    exact = target.dtype in (torch.float32, torch.float64)  # in bfloat16 a near-tie may flip: reported, not an error
    problems = differences(results, exact)
    if problems:
        print("\n".join(problems), file=sys.stderr)
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 1 if problems and exact else 0


def _add_training_args(parser) -> None:
    """One flag per TrainingConfig field, typed from the dataclass."""
    from .training import FIELD_HELP, LOSSES, TrainingConfig

    hints = typing.get_type_hints(TrainingConfig)
    for f in dataclasses.fields(TrainingConfig):
        if f.name == "extra":
            continue
        flag, kind, help_text = "--" + f.name.replace("_", "-"), hints[f.name], FIELD_HELP[f.name]
        required = f.default is dataclasses.MISSING
        default = None if required else f.default
        if kind in (bool, bool | None):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=help_text)
        elif f.name == "loss":
            parser.add_argument(flag, choices=LOSSES, default=default, help=help_text)
        elif kind == list[int] | None:
            parser.add_argument(flag, type=int, nargs="+", default=default, help=help_text)
        else:
            simple = (int, float, str)
            base = kind if kind in simple else next(t for t in typing.get_args(kind) if t in simple)
            parser.add_argument(flag, type=base, default=default, required=required, help=help_text)


def _store_arguments(p) -> None:
    """What a feature store holds: shared by prepare-data --save-features and store-features."""
    p.add_argument("--target-layer-ids", type=int, nargs="+",
                   help="target layers to store (default: the DFlash rule for --num-draft-layers)")
    p.add_argument("--num-draft-layers", type=int, default=1,
                   help="layers of the planned drafter, for the default --target-layer-ids")
    p.add_argument("--target-topk", type=int, default=0,
                   help="also store the target's top-K next-token probabilities (for train --loss lk); 0: none")


_DTYPE_HELP = ("dtype of the target: auto = bfloat16 where the device computes it natively (CPUs with "
               "AVX512-BF16/AMX, GPUs), else float32")
_DRAFTER_DTYPE_HELP = ("dtype of the drafter: auto = bfloat16 where the device computes it natively, else float32. "
                       "Its drafts only propose, so a bfloat16 drafter beside a float32 target costs about half per "
                       "step (memory-bound) and the output stays the target's; pass float32 to match the target")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hf-dflash", description="DFlash speculative decoding for transformers")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("demo", help="speculative decoding on a real target, compared with plain generate")
    p.add_argument("--target", default=SMOLLM2_ID, help="target model (default: the packaged SmolLM2-135M-Instruct)")
    p.add_argument("--drafter", help="drafter folder or Hub id (default: the shipped drafter, else an untrained one)")
    p.add_argument("--block-size", type=int, default=8, help="block size of an untrained drafter")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--num-prompts", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch threads, pinned so timings compare")
    p.add_argument("--dtype", default="auto", help=_DTYPE_HELP)
    p.add_argument("--drafter-dtype", default="auto", help=_DRAFTER_DTYPE_HELP)
    p.add_argument("--compile", action="store_true",
                   help="also time plain generate and DFlash at their best (a static cache, compiled as transformers "
                        "compiles it, on any device; DFlash on the fixed-shape path; the first call of a cache length "
                        "compiles, untimed) and report the faster DFlash over the faster plain")
    p.set_defaults(func=demo)

    p = sub.add_parser("prepare-data", help="regenerate responses with the target: training data for a drafter")
    p.add_argument("--target", required=True, help="target model: Hub id or local folder")
    p.add_argument("--prompts", required=True, help="JSONL/JSON/text file of prompts, or 'sharegpt' (packaged)")
    p.add_argument("--output", required=True, help="JSONL to write (appended to, resumable)")
    p.add_argument("--limit", type=int, help="use at most this many prompts")
    p.add_argument("--max-new-tokens", type=int, default=512, help="longest response regenerated")
    p.add_argument("--max-prompt-tokens", type=int, default=1024, help="skip longer prompts")
    p.add_argument("--batch-size", type=int, default=16,
                   help="prompts generated together (grouped by length); 64 on a 2-core CPU in bf16: 315 tokens/s")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy responses")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling for temperature > 0")
    p.add_argument("--enable-thinking", action=argparse.BooleanOptionalAction, default=None,
                   help="thinking mode for chat templates that have one (recorded in the data)")
    p.add_argument("--dtype", default="auto",
                   help="dtype of the target: auto = bfloat16 where the device computes it natively (CPUs with "
                        "AVX512-BF16/AMX, GPUs: regeneration is faster there), else float32")
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    p.add_argument("--save-features", metavar="DIR",
                   help="also store the target's features of every sample, captured while generating "
                        "(train with --features DIR: no target pass in training)")
    p.add_argument("--engine", choices=["transformers", "vllm"], default="transformers",
                   help="vllm: regenerate with vLLM (continuous batching; features from store-features after)")
    p.add_argument("--vllm-python", help=VLLM_PYTHON_HELP)
    _store_arguments(p)
    p.set_defaults(func=prepare_data_cmd)

    p = sub.add_parser("store-features", help="the feature store of prepared data, without regenerating it")
    p.add_argument("--target", required=True, help="target model: Hub id or local folder (the one that wrote --data)")
    p.add_argument("--data", required=True, help="JSONL written by prepare-data")
    p.add_argument("--output", required=True, help="store folder (resumable: samples already in it are skipped)")
    p.add_argument("--batch-size", type=int, default=8, help="samples per forward (grouped by length)")
    p.add_argument("--dtype", default="auto", help=_DTYPE_HELP)
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    _store_arguments(p)
    p.set_defaults(func=store_features_cmd)

    p = sub.add_parser("train", help="train a drafter (also under `accelerate launch -m hf_dflash train`)")
    _add_training_args(p)
    p.set_defaults(func=train_cmd)

    p = sub.add_parser("bench", help="acceptance length and speedup on prompt sets, with baselines, in one run")
    p.add_argument("--target", default=SMOLLM2_ID, help="target model (default: the packaged SmolLM2-135M-Instruct)")
    p.add_argument("--drafter", help="drafter folder or Hub id (default: an untrained one, reported as such)")
    p.add_argument("--sets", nargs="+", default=["gsm8k", "mbpp", "alpaca"],
                   help="gsm8k, mbpp, alpaca (from --bench-dir), humaneval, mtbench (pip packages), or prompt files")
    p.add_argument("--bench-dir", help="folder of the gsm8k/mbpp/alpaca files (default: $HF_DFLASH_BENCH_DIR)")
    p.add_argument("--num-prompts", type=int, default=8, help="first N prompts of each set")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1])
    p.add_argument("--modes", nargs="+", choices=["greedy", "sampling"], default=["greedy"])
    p.add_argument("--temperature", type=float, default=0.7, help="for the sampling mode")
    p.add_argument("--block-sizes", type=int, nargs="+", help="default: the drafter's own block size")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--assistant-confidence-threshold", type=float,
                   help="DFlash steps verify no drafts below this first-draft probability (default: the drafter's)")
    p.add_argument("--baselines", nargs="*", choices=list(BASELINES), default=list(DEFAULT_BASELINES),
                   help="static: plain generate with a static cache, compiled where transformers compiles it; packed: "
                        "with its linears prepacked (hf_dflash.cpu_ops.packed_linears); vllm: "
                        "vLLM plain and with the drafter (greedy; a vLLM virtualenv: --vllm-python)")
    p.add_argument("--vllm-python", help=VLLM_PYTHON_HELP)
    p.add_argument("--cache-implementation", choices=["static"],
                   help="static: the DFlash calls take the fixed-shape path (docs/usage.md)")
    p.add_argument("--compile", action="store_true",
                   help="compile the static baseline and the fixed-shape path on any device (transformers compiles "
                        "them on accelerators only)")
    p.add_argument("--threads", type=int, default=1, help="torch threads, pinned so timings compare")
    p.add_argument("--warmup", type=int, default=1, help="untimed prompt batches per run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="auto", help=_DTYPE_HELP)
    p.add_argument("--drafter-dtype", default="auto", help=_DRAFTER_DTYPE_HELP)
    p.add_argument("--device", help="cuda, cuda:1, cpu, ... (default: cuda if available, else cpu)")
    p.add_argument("--draft-tree-sizes", type=_tree_size, nargs="+", metavar="N",
                   help="draft_tree_size of the DFlash runs, each reported as its own run and measured in turns "
                        "against one plain call per prompt: 0 (the chain), N drafts, auto (default: the drafter's own)")
    p.add_argument("--oracle", action="store_true",
                   help="always-right drafts (the target's greedy continuation, placed after the real drafter ran): "
                        "the loop's speedup against the ceiling B x t(1) / t(B), forwards timed after each step")
    p.add_argument("--random-target", metavar="CONFIG",
                   help="a random-weight target instead of --target and --sets: a config.json path or a named shape "
                        f"({', '.join(RANDOM_SHAPES)}), with a matching random drafter and random prompts; "
                        "meant for --oracle")
    p.add_argument("--prompt-tokens", type=int, default=128, help="prompt length of --random-target's prompts")
    p.add_argument("--draft-layers", type=int,
                   help="layers of --random-target's drafter (default: the shape's: 5 for qwen3-8b, qwen3.5)")
    p.add_argument("--output-dir", default="bench_out")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG (no matplotlib needed)")
    p.set_defaults(func=bench_cmd)

    p = sub.add_parser("bigram-prior", help="count a drafter's bigram prior from its training data (hf_dflash.bigram)")
    p.add_argument("folder", help="a saved drafter folder")
    p.add_argument("--data", required=True, help="the prepared JSONL it was trained on (hf-dflash prepare-data)")
    p.add_argument("--output", help="write the drafter with its prior here (default: into FOLDER)")
    p.add_argument("--max-length", type=int, default=None, help="count only the first N tokens of each sample")
    p.add_argument("--beta", type=float, default=BIGRAM_DEFAULTS["beta"], help="strength of the prior (0: none)")
    p.add_argument("--mix", type=float, default=BIGRAM_DEFAULTS["mix"], help="weight of the bigram against the unigram")
    p.add_argument("--min-count", type=int, default=BIGRAM_DEFAULTS["min_count"],
                   help="pairs seen fewer times are left out")
    p.set_defaults(func=bigram_prior_cmd)

    p = sub.add_parser("card", help="render (or refresh) the README.md model card of a saved drafter folder")
    p.add_argument("folder")
    p.add_argument("--repo-id", help="the Hub repository the card's usage examples name")
    p.add_argument("--results", help="a benchmark JSON (hf-dflash bench) to report")
    p.set_defaults(func=card_cmd)

    p = sub.add_parser("push", help="upload a saved drafter folder to the Hub (card rendered for the repo)")
    p.add_argument("folder")
    p.add_argument("repo_id")
    p.add_argument("--private", action="store_true")
    p.add_argument("--token", help="Hub token (default: the logged-in one)")
    p.add_argument("--revision", help="branch to push to")
    p.add_argument("--dry-run", action="store_true", help="list what would be uploaded; upload nothing")
    p.set_defaults(func=push_cmd)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
