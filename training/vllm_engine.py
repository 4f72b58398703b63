"""A vLLM generation engine for rollouts (``progpo-suite[vllm]`` on GPU, ``vllm-cpu`` for CPU tests).

It implements the :class:`training.engines.GenerationEngine` protocol on vLLM's own engine
(``LLM.llm_engine``: ``add_request`` and ``step``, its continuous batching across every request in flight,
prefix caching on): token-id prompts in, each with its own seed, sampled token ids and their log-probs out.
The lock-step rollout adds a turn's requests and steps until they end (what ``LLM.generate`` does); the
per-episode rollout adds each episode's next request as its env step returns
(:class:`training.engine_loop.EngineLoop`). :meth:`VLLMEngine.sync_weights` pushes the trainer's current
weights into the running engine after each update, so vLLM always samples from the policy being trained.

Log-probs. The trainer differentiates ``log_softmax(logits / T)`` (:mod:`training.sampling`) and compares it
with the log-probs recorded at sampling time (``first_ratio_mean`` must be 1). vLLM returns log-probs of the
raw logits unless asked for the processed ones: with ``logprobs_mode="processed_logprobs"`` its sampler
returns ``log_softmax`` of the logits *after* temperature and top-k/top-p filtering
(``vllm/v1/sample/sampler.py``, ``Sampler.sample``). With ``top_p = 1`` that is exactly the tempered
distribution the trainer uses; with ``top_p < 1`` it would be the renormalised nucleus, which
:class:`training.engines.TransformersEngine` does not record, so this engine refuses ``top_p < 1`` rather
than record log-probs of a different distribution.

Placement and weight sync. The engine runs inside the trainer's process (vLLM's in-process engine core:
``VLLM_ENABLE_V1_MULTIPROCESSING=0``), on the trainer's device: on one GPU with the uniprocess executor, and
under ``torchrun`` with vLLM's ``external_launcher`` executor (made for torchrun: each rank's engine on its
own ``cuda:LOCAL_RANK``, tensor parallel 1; the ranks' engines are independent — no collective couples their
``generate`` calls — while vLLM's own process groups live inside the torchrun world). Because the worker is in
this process, :meth:`VLLMEngine.sync_weights` hands it the trained weights as a stream of tensors
(:func:`training.weight_sync.stream_weights`: one parameter at a time, gathered from the FSDP2 shards, cast to
the engine's dtype on the device) through vLLM's in-place ``reload_weights``, which runs the checkpoint loader
(Hugging Face names; it fuses q/k/v and gate/up itself) and redoes the kernel-specific post-processing:
no whole-model copy, no host memory, no RPC. LoRA adapters are merged on the fly (vLLM's model has no
adapters). After loading, the prefix cache is reset: its KV blocks were computed with the old weights.

CUDA graphs. ``rollout.vllm_enforce_eager`` (default false) leaves vLLM's CUDA-graph capture on, about 2×
faster decoding than eager mode; on the CPU the engine is always eager (vllm-cpu has no graphs: not eager
would mean compiling the model with torch.compile, slow to start and with other kernels).

CPU. vllm-cpu binds its OpenMP threads when the worker starts and then makes ``torch.set_num_threads`` a
no-op in its process (here: the trainer's), so the trainer sets its threads before building the engine. Its
KV cache size comes from ``VLLM_CPU_KVCACHE_SPACE`` (GiB), which this engine sets to ``cpu_kv_cache_gib``
unless the environment already does. Chunked prefill is off on CPU (it crashes seeded sampling there; see
``__init__``).

Example (needs vLLM; see ``tests/training/test_vllm_engine.py``):
    >>> engine = VLLMEngine("runs/quickstart/tiny_policy", tokenizer)  # doctest: +SKIP
    >>> out = engine.generate([[8193, 872, 198]], temperature=1.0, max_new_tokens=8,
    ...                       seeds=[0])  # doctest: +SKIP
    >>> len(out.token_ids[0]) == len(out.logprobs[0])  # doctest: +SKIP
    True
    >>> engine.sync_weights(trainer_model)  # doctest: +SKIP
"""

from __future__ import annotations

import os

import torch

from training.engines import SteppedEngine
from training.policy import resolve_dtype, stop_token_ids
from training.sampling import SampleRequest, SampleResult
from training.weight_sync import stream_weights

#: vLLM's default scheduler token budget per step on CPU (``EngineArgs`` for the ``LLM`` class).
_CPU_TOKENS_PER_STEP = 4096


class VLLMEngine(SteppedEngine):
    """Samples with vLLM from a saved model folder.

    Args:
        model_path: A transformers folder (the policy as built or exported).
        tokenizer: The policy's tokenizer (for stop ids: eos, ``<|im_end|>``, ``<|endoftext|>``, as the
            transformers engine).
        top_p: Nucleus threshold; must be 1.0 (see the module docstring).
        seed: Engine seed (every request carries its own seed: :attr:`training.sampling.SampleRequest.seed`).
        dtype: ``auto`` (the trainer's rule: bfloat16 on CUDA, float32 on CPU), ``float32``, ``bfloat16``...
            Use the trainer's compute dtype (``model.compute_dtype``), or the recorded log-probs will not
            match its forward pass.
        max_model_len: Longest prompt + response.
        gpu_memory_utilization: Share of GPU memory vLLM may take (``rollout.vllm_gpu_memory_utilization``;
            the trainer shares the GPU).
        enforce_eager: No CUDA graphs (``rollout.vllm_enforce_eager``; slower decoding, faster start-up).
        torchrun: One engine per torchrun rank on the rank's own device (vLLM's ``external_launcher``);
            else one engine in a single process.
        cpu_kv_cache_gib: KV cache size on CPU (``VLLM_CPU_KVCACHE_SPACE`` unless already set).
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
        enforce_eager: bool = False,
        torchrun: bool = False,
        cpu_kv_cache_gib: int = 1,
    ):
        if top_p < 1.0:
            raise ValueError(
                f"rollout.engine=vllm needs rollout.top_p=1.0 (got {top_p}): vLLM's processed log-probs "
                "are those of the renormalised nucleus, not of the tempered distribution the trainer "
                "differentiates, so the PPO ratio would not start at 1"
            )
        try:
            from vllm import LLM
        except ImportError as exc:
            raise ImportError(
                "rollout.engine=vllm needs vLLM: pip install 'progpo-suite[vllm]' "
                "(GPU) or scripts/setup_vllm_cpu.sh (CPU, into .venv-vllm)"
            ) from exc
        self.stop_token_ids = stop_token_ids(tokenizer)
        on_cuda = torch.cuda.is_available()
        self.dtype = resolve_dtype(dtype, torch.device("cuda" if on_cuda else "cpu"))
        # the engine core and its worker in this process: the weight sync hands tensors over in memory
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        kwargs = dict(
            model=model_path,
            tokenizer=model_path,
            dtype=str(self.dtype).removeprefix("torch."),
            seed=seed,
            max_model_len=max_model_len,
            # on the CPU "not eager" is torch.compile of the model (slow to start, other kernels), no graphs
            enforce_eager=enforce_eager or not on_cuda,
            logprobs_mode="processed_logprobs",
            generation_config="vllm",  # the checkpoint's sampling defaults must not change our params
            enable_prefix_caching=True,  # a group's copies share their first prompt; said, not assumed
        )
        if torchrun:
            kwargs["distributed_executor_backend"] = "external_launcher"
        if on_cuda:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        else:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cpu_kv_cache_gib))
            # Chunked prefill samples a token for a prompt's unfinished chunk, discards it and rewinds the
            # request's seeded generator (GPUModelRunner._bookkeeping_sync); a CPU generator cannot rewind
            # ("CPU Generator does not use offset"), which kills the engine as soon as a batch of seeded
            # requests has more prompt tokens than one step takes. Whole prompts per step avoid the rewind.
            kwargs["enable_chunked_prefill"] = False
            kwargs["max_num_batched_tokens"] = max(_CPU_TOKENS_PER_STEP, max_model_len)
        self.llm = LLM(**kwargs)
        self._next_id = 0
        self._unfinished = 0  # requests added and not yet returned by step()

    def add_request(self, request: SampleRequest) -> int:
        """Queue ``request`` in vLLM's engine (its continuous batching and prefix caching); returns its id.

        No constrained decoding: ``request.candidates`` must be ``None`` (the config refuses
        ``rollout.constrained_actions`` with vLLM)."""
        if request.candidates is not None:
            raise NotImplementedError("the vLLM engine does not do constrained decoding")
        from vllm import SamplingParams

        params = SamplingParams(
            temperature=request.temperature,
            top_p=1.0,
            max_tokens=request.max_new_tokens,
            logprobs=0,  # the sampled token's log-prob only
            stop_token_ids=self.stop_token_ids,
            seed=int(request.seed),
            skip_special_tokens=False,
        )
        request_id = self._next_id
        self._next_id += 1
        self.llm.llm_engine.add_request(str(request_id), {"prompt_token_ids": list(request.prompt)}, params)
        self._unfinished += 1
        return request_id

    def has_unfinished(self) -> bool:
        """Whether requests are queued or being decoded."""
        return self._unfinished > 0

    def step(self) -> list[SampleResult]:
        """One step of vLLM's engine (its scheduler admits and retires requests); the results of those that
        ended."""
        results = []
        for output in self.llm.llm_engine.step():
            if not output.finished:
                continue
            completion = output.outputs[0]
            ids = list(completion.token_ids)
            logprobs = [
                float(step[token].logprob) for step, token in zip(completion.logprobs, ids, strict=True)
            ]
            results.append(
                SampleResult(
                    int(output.request_id), ids, logprobs, finished=completion.finish_reason == "stop"
                )
            )
        self._unfinished -= len(results)
        return results

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Load ``model``'s current weights into the engine, one tensor at a time in the engine's dtype
        (:func:`training.weight_sync.stream_weights`; under FSDP2 a collective every rank runs), then drop
        the stale prefix cache."""
        worker = self.llm.llm_engine.model_executor.driver_worker.worker
        worker.reload_weights(weights_iterator=stream_weights(model, self.dtype), is_checkpoint_format=True)
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM did not reset its prefix cache after the weight sync")

    def close(self) -> None:
        """Shut the engine down (before the process group is destroyed: vLLM's groups live in it)."""
        self.llm.llm_engine.engine_core.shutdown()
