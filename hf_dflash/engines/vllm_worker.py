"""A vLLM engine behind a pipe: run by `hf_dflash.engines.VLLMEngine` with the python of a virtualenv where vLLM is
installed (vLLM pins its own transformers, so it lives apart from hf-dflash). Imports nothing of hf-dflash.

Protocol, one JSON object per line. The first line read holds the engine's settings (`target`, `drafter` or null,
`num_speculative_tokens`, `dtype`, `max_model_len`, `seed`, `engine_args`: more `LLM` arguments); the worker answers
{"ready": true} once the engine is built. Each request {"prompts": [[token ids], ...], "max_tokens", "temperature",
"top_p", "seed"} is answered with {"sequences": [[new token ids], ...], "seconds": the engine's wall time, "drafts":
speculative steps, "accepted": accepted draft tokens} (both 0 without a drafter); an empty line or the end of input
stops it. A failed request is answered {"error": "..."}. vLLM's own output goes to stderr."""

import json
import os
import sys
import time


def counters(llm) -> dict:
    """The engine's running totals of speculative steps and accepted drafts (zeros without a drafter)."""
    totals = {"vllm:spec_decode_num_drafts": 0, "vllm:spec_decode_num_accepted_tokens": 0}
    for metric in llm.get_metrics():
        if metric.name in totals:
            totals[metric.name] += int(metric.value)
    return {"drafts": totals["vllm:spec_decode_num_drafts"],
            "accepted": totals["vllm:spec_decode_num_accepted_tokens"]}


def build(settings: dict):
    from vllm import LLM

    speculative = None
    if settings.get("drafter"):
        speculative = {"method": "dflash", "model": settings["drafter"],
                       "num_speculative_tokens": settings["num_speculative_tokens"]}
    return LLM(model=settings["target"], dtype=settings.get("dtype", "auto"),
               max_model_len=settings.get("max_model_len", 2048), seed=settings.get("seed", 0),
               speculative_config=speculative, disable_log_stats=False, **settings.get("engine_args", {}))


def serve(llm, request: dict) -> dict:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=request["max_tokens"], temperature=request.get("temperature", 0.0),
                            top_p=request.get("top_p", 1.0), seed=request.get("seed"))
    prompts = [{"prompt_token_ids": ids} for ids in request["prompts"]]
    before = counters(llm)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    after = counters(llm)
    return {"sequences": [list(out.outputs[0].token_ids) for out in outputs], "seconds": seconds,
            **{key: after[key] - before[key] for key in after}}


def main() -> None:
    # only replies go to the pipe: vLLM and the engine processes it starts print to file descriptor 1, sent to stderr
    reply = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    llm = build(json.loads(sys.stdin.readline()))
    print(json.dumps({"ready": True}), file=reply, flush=True)
    for line in sys.stdin:
        if not line.strip():
            break
        try:
            answer = serve(llm, json.loads(line))
        except Exception as error:  # answered, so the caller can say what failed
            answer = {"error": f"{type(error).__name__}: {error}"}
        print(json.dumps(answer), file=reply, flush=True)


if __name__ == "__main__":
    main()
