"""The micro-measurements behind `hf_dflash/cpu_ops.py` and "The loop against its ceiling" in RESULTS.md, one thread.

    OMP_NUM_THREADS=1 python examples/drafters/cpu_ops_micro.py argmax     # the verification's argmax, after a forward
    OMP_NUM_THREADS=1 python examples/drafters/cpu_ops_micro.py linear     # F.linear vs packed, in / out of cache
    OMP_NUM_THREADS=1 python examples/drafters/cpu_ops_micro.py replay     # the drafter's in-loop call, replayed hot
    OMP_NUM_THREADS=1 python examples/drafters/cpu_ops_micro.py forward    # the target's forward, no_grad / inference
    OMP_NUM_THREADS=1 python examples/drafters/cpu_ops_micro.py head       # the draft head's product, in / out of cache
    OMP_NUM_THREADS=1 python examples/drafters/cpu_ops_micro.py head-vocab # the head + softmax + top-k per vocabulary
    OMP_NUM_THREADS=1 python examples/drafters/cpu_ops_micro.py one-token-mask  # a one-token forward with / without a mask
    OMP_NUM_THREADS=1 python examples/drafters/cpu_ops_micro.py prior      # the bigram prior's cost in building a tree
    python examples/drafters/cpu_ops_micro.py one-layer DIR                # G cut to its first layer, for --oracle
"""
import functools, sys, time, torch
from torch.nn import functional as F
from transformers import AutoModel, DynamicCache
import hf_dflash
from hf_dflash.bench import _encode, _stop_ids, chat_inputs, load_prompt_set
from hf_dflash.cpu_ops import argmax, pack_linears
from hf_dflash.generation import dflash_decode
from hf_dflash.oracle import OracleDecoder, OracleDrafts
from hf_dflash.packaged import load_packaged
from hf_dflash.tree import DraftTree, tree_attention_mask

G = "examples/drafters/smollm2-135m-instruct-dflash"
torch.set_num_threads(1)
torch.set_grad_enabled(False)
what = sys.argv[1]


def median_ms(times):
    return sorted(times)[len(times) // 2] * 1e3


def in_both_modes(call, reset, n):
    """Median ms of `call` under no_grad (as plain `generate`) and inference mode (as the loop), in turns; `reset`
    after each call (a cache crop)."""
    times = {"no_grad": [], "inference mode": []}
    for i in range(n):
        name = list(times)[i % 2]
        with torch.inference_mode(name == "inference mode"), torch.no_grad():
            began = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - began)
        reset()
    return {name: round(median_ms(t), 2) for name, t in times.items()}


def in_and_out_of_cache(label, calls: dict, repeats: int) -> None:
    """Median ms of each call with its operands in cache, then after a 400 MB sweep before each call ("out of
    cache": the target's forward sweeps 270 MB every step)."""
    sweep = torch.empty(400 << 20, dtype=torch.uint8)
    for cold in (False, True):
        row = {}
        for name, call in calls.items():
            times = []
            for _ in range(repeats):
                if cold:
                    sweep.add_(1)
                began = time.perf_counter()
                call()
                times.append(time.perf_counter() - began)
            row[name] = round(median_ms(times), 3)
        print(label, "out of cache" if cold else "in cache", row, "ms")


if what == "argmax":  # right after the target's verification forward, as in the loop (the logits come out cold)
    target, tok = load_packaged(dtype=torch.bfloat16)
    cache = DynamicCache(config=target.config)
    target(**chat_inputs(tok, load_prompt_set("gsm8k", 1)[0].messages), cache=cache)
    for block in (8, 16):
        ids = torch.randint(0, target.config.vocab_size, (1, block))
        times = {"max(-1)": [], "cpu_ops.argmax": []}
        for _ in range(15):
            for name, fn in (("max(-1)", lambda s: s.max(-1).indices), ("cpu_ops.argmax", argmax)):
                logits = target(input_ids=ids, cache=cache).logits
                cache.crop(-block)
                began = time.perf_counter()
                fn(logits)
                times[name].append(time.perf_counter() - began)
        print(block, {name: round(median_ms(t), 3) for name, t in times.items()}, "ms")

elif what == "linear":
    for rows, k, n in [(16, 576, 1536), (16, 1536, 576), (16, 576, 576), (31, 576, 192)]:
        x, w = torch.randn(rows, k).bfloat16(), torch.randn(n, k).bfloat16()
        packed = torch.ops.mkldnn._reorder_linear_weight(w, 16)
        calls = {"F.linear": lambda: F.linear(x, w),
                 "packed": lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")}
        assert torch.equal(calls["F.linear"](), calls["packed"]())
        in_and_out_of_cache((rows, k, n), calls, repeats=40)

elif what == "head":  # G's draft head: 8,192 rows of the target's head, 15 draft positions, the layouts tried
    w = (torch.randn(8192, 576) * 0.02).bfloat16()
    for rows in (15, 16, 32):
        h = torch.randn(rows, 576).bfloat16()
        packed = torch.ops.mkldnn._reorder_linear_weight(w, rows)
        calls = {"W @ h.T": lambda: w @ h.T, "h @ W.T": lambda: h @ w.T,
                 "packed": lambda: torch.ops.mkldnn._linear_pointwise(h, packed, None, "none", [], "")}
        in_and_out_of_cache(rows, calls, repeats=21)

elif what == "head-vocab":  # what a wider draft vocabulary costs a step: "auto"'s head, softmax and top-k, packed
    for dtype in (torch.bfloat16, torch.float32):
        for vocab in (8192, 16384, 32768):
            head = pack_linears(torch.nn.Linear(576, vocab, bias=False, dtype=dtype))
            for rows in (7, 15):  # block 8 and block 16's draft positions
                h = torch.randn(1, rows, 576, dtype=dtype)
                call = lambda: head(h).float().softmax(-1).topk(16, dim=-1)
                in_and_out_of_cache((str(dtype)[6:], vocab, rows), {"head + softmax + top-16": call}, repeats=21)

elif what == "one-token-mask":  # SDPA's one-query CPU kernel without a mask (`hf_dflash.tree.mask_one_token`)
    for dtype in (torch.bfloat16, torch.float32):
        target, tok = load_packaged(dtype=dtype)
        for batch in (1, 4):
            cache = DynamicCache(config=target.config)
            target(input_ids=torch.randint(0, 1000, (batch, 320)), cache=cache)  # a 320-token context
            valid = torch.ones(batch, 320, dtype=torch.bool)
            one, two = torch.randint(0, 1000, (batch, 1)), torch.randint(0, 1000, (batch, 2))
            mask = tree_attention_mask(DraftTree.chain(one), valid, cache, dtype)
            calls = {"1 token, no mask": (one, None), "1 token, 4-D mask": (one, mask), "2 tokens, no mask": (two, None)}
            times = {name: [] for name in calls}
            for _ in range(12):  # in turns, so that the machine's drift reaches every call alike
                for name, (ids, attention_mask) in calls.items():
                    began = time.perf_counter()
                    with torch.inference_mode():
                        target(input_ids=ids, attention_mask=attention_mask, cache=cache)
                    times[name].append(time.perf_counter() - began)
                    cache.crop(-ids.shape[1])
            print(str(dtype)[6:], "batch", batch, {name: round(median_ms(t), 1) for name, t in times.items()}, "ms")

elif what == "prior":  # a step's tree with and without the shipped drafter's bigram prior, 8 / 16 / 31 candidates
    from hf_dflash.bigram import conditional_probs
    from hf_dflash.tree import build_tree

    drafter = AutoModel.from_pretrained(G)
    probs = torch.rand(1, 7, 8192, generator=torch.Generator().manual_seed(0)).softmax(-1)
    for k in (8, 16, 31):  # a tree of k nodes from k candidates a position, as `generate` builds it ("auto": 31)
        p, i = probs.topk(k, dim=-1)
        ids, root = drafter.draft_vocab[i], drafter.draft_vocab[5:6]
        calls = {"drafter": lambda: build_tree(root, ids, p, k),
                 "prior": lambda: build_tree(root, ids, conditional_probs(ids, p, drafter.bigram_prior), k)}
        times = {name: [] for name in calls}
        for _ in range(60):
            for name, call in calls.items():
                began = time.perf_counter()
                call()
                times[name].append(time.perf_counter() - began)
        print(k, {name: round(median_ms(t), 3) for name, t in times.items()}, "ms")

elif what == "replay":  # the drafter's call at a GSM8K oracle step, block 16, repeated 50 times in that state
    target, tok = load_packaged(dtype=torch.bfloat16)
    drafter = AutoModel.from_pretrained(G, dtype=torch.bfloat16).eval()
    drafter.config.block_size = 16
    inputs = _encode([load_prompt_set("gsm8k", 1)[0]], tok, tok.pad_token_id, "cpu")
    prompt_len = inputs["input_ids"].shape[1]
    plain = target.generate(**inputs, max_new_tokens=128, do_sample=False)
    forward, calls = drafter.forward, []

    def replaying(*args, **kwargs):
        calls.append(None)
        if len(calls) == 6:
            cache = kwargs["cache"]
            kept = cache.get_seq_length()
            medians = in_both_modes(lambda: forward(*args, **kwargs),
                                    lambda: cache.crop(kept - cache.get_seq_length()), 100)
            print("drafter forward replayed in cache:", medians, "ms")
        return forward(*args, **kwargs)

    drafter.forward = replaying
    drafts = OracleDrafts.from_plain(plain, prompt_len, 128, None, tok.pad_token_id, _stop_ids(target))
    decode = functools.partial(dflash_decode, drafter=drafter, draft_tree_size=0,
                               decoder_class=functools.partial(OracleDecoder, oracle=drafts))
    hf_dflash.hooks.original_generate(target, **inputs, custom_generate=decode, max_new_tokens=128, do_sample=False)

elif what == "forward":  # the target's forward over 1 / 16 tokens after a GSM8K prompt, no_grad vs inference mode
    target, tok = load_packaged(dtype=torch.bfloat16)
    cache = DynamicCache(config=target.config)
    target(**chat_inputs(tok, load_prompt_set("gsm8k", 1)[0].messages), cache=cache)
    for k in (1, 16):
        ids = torch.randint(0, 1000, (1, k))
        medians = in_both_modes(lambda: target(input_ids=ids, cache=cache, output_hidden_states=True),
                                lambda: cache.crop(-k), 60)
        print(k, medians, "ms")

elif what == "one-layer":  # its cost only: then `hf-dflash bench --drafter DIR --oracle ...` as in RESULTS.md
    drafter = AutoModel.from_pretrained(G, dtype=torch.bfloat16)
    drafter.layers = drafter.layers[:1]
    drafter.config.num_hidden_layers, drafter.config.layer_types = 1, drafter.config.layer_types[:1]
    drafter.save_pretrained(sys.argv[2])
    print("wrote", sys.argv[2])
