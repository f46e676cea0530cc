"""Run by path by a vLLM virtualenv's python (it imports nothing of hf-dflash; `tests/test_engines.py`): argv TARGET
DRAFTER_FOLDER. Builds vLLM's draft
model for DRAFTER_FOLDER (a DFlash2 drafter hf-dflash saved) with vLLM's own loader, which refuses a checkpoint
missing any parameter or holding an unknown one, and prints its class and each loaded tensor's sum as JSON. vLLM's
CPU build refuses to *run* a DFlash2 ("candidate-head") draft (its selector runs in the V2 GPU model runner only), a
check made while its engine config is built; that one check is lifted here, since what is tested is what its loader
reads."""
import json
import sys
from unittest import mock


def main() -> None:
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader import get_model

    target, drafter = sys.argv[1:3]
    with mock.patch.object(VllmConfig, "_is_dflash_candidate_draft", lambda self: False):
        config = EngineArgs(model=target, dtype="float32", enforce_eager=True, speculative_config={
            "method": "dflash", "model": drafter, "num_speculative_tokens": 7}).create_engine_config()
    with set_current_vllm_config(config):
        init_distributed_environment(world_size=1, rank=0, local_rank=0,
                                     distributed_init_method="tcp://127.0.0.1:29517", backend="gloo")
        initialize_model_parallel(1, 1)
        # the GPU loader's cache release after loading, and the CPU build's repacking of linear weights after it
        # (which leaves their `weight` parameters empty): what is compared is what the loader read
        with (mock.patch("torch.accelerator.empty_cache", lambda: None),
              mock.patch("vllm.model_executor.model_loader.base_loader.process_weights_after_loading",
                         lambda *a: None)):
            model = get_model(vllm_config=config, model_config=config.speculative_config.draft_model_config)
    print(json.dumps({"class": type(model).__name__,
                      "tensors": {n: float(p.double().sum()) for n, p in model.named_parameters()}}))


if __name__ == "__main__":
    main()
