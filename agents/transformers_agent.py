"""An agent around a local causal LM: ``AutoModelForCausalLM.from_pretrained(path)`` and its chat template.

Prompts of a batch are rendered with the tokenizer's chat template (``add_generation_prompt=True``),
left-padded (so every row's generation starts at the same position) and generated together in chunks of
``batch_size`` rows. Sampling uses one ``torch.Generator``-free seed per chunk (``torch.manual_seed`` with the
first row's seed): a run is reproducible for the same batching; greedy decoding (``temperature=0``) is
reproducible regardless.

Example:
    >>> agent = TransformersAgent(TransformersConfig(model_path="checkpoints/qwen2.5-1.5b"))  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence

from agents.base import Generation, PromptConfig, PromptedAgent
from agents.llm_config import TransformersConfig


class TransformersAgent(PromptedAgent):
    """A :class:`~agents.base.PromptedAgent` generating with a local transformers model.

    Args:
        config: Model path, device, sampling.
        prompt_config: Prompt template, history length, length bound.
    """

    def __init__(self, config: TransformersConfig, prompt_config: PromptConfig | None = None):
        super().__init__(prompt_config)
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.config = config
        self.torch = torch
        self.device = torch.device(config.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.tokenizer = AutoTokenizer.from_pretrained(config.model_path, local_files_only=True)
        if self.tokenizer.chat_template is None:
            raise ValueError(f"the tokenizer in {config.model_path} has no chat template")
        self.tokenizer.padding_side = "left"
        self.tokenizer.truncation_side = "left"  # an over-long prompt keeps its end (the current step)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        dtype = config.dtype if config.dtype == "auto" else getattr(torch, config.dtype)
        self.model = AutoModelForCausalLM.from_pretrained(
            config.model_path, dtype=dtype, local_files_only=True
        ).to(self.device)
        self.model.eval()

    def generate(self, prompts: Sequence[list[dict[str, str]]], seeds: Sequence[int]) -> list[Generation]:
        torch, config = self.torch, self.config
        texts = [
            self.tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False) for p in prompts
        ]
        out: list[Generation] = []
        for start in range(0, len(texts), config.batch_size):
            chunk = texts[start : start + config.batch_size]
            batch = self.tokenizer(
                chunk,
                return_tensors="pt",
                padding=True,
                truncation=True,
                max_length=config.max_prompt_tokens,
                add_special_tokens=False,
            ).to(self.device)
            sample = config.temperature > 0
            kwargs = {
                "do_sample": sample,
                "max_new_tokens": config.max_new_tokens,
                "pad_token_id": self.tokenizer.pad_token_id,
            }
            if sample:
                kwargs.update(temperature=config.temperature, top_p=config.top_p)
                torch.manual_seed(int(seeds[start]))
            else:
                kwargs.update(temperature=None, top_p=None, top_k=None)
            with torch.inference_mode():
                generated = self.model.generate(**batch, **kwargs)
            prompt_width = batch["input_ids"].shape[1]
            prompt_lengths = batch["attention_mask"].sum(dim=1).tolist()
            for row, new_tokens in enumerate(generated[:, prompt_width:]):
                ids = new_tokens.tolist()
                if self.tokenizer.eos_token_id is not None and self.tokenizer.eos_token_id in ids:
                    ids = ids[: ids.index(self.tokenizer.eos_token_id) + 1]
                while ids and ids[-1] == self.tokenizer.pad_token_id:
                    ids.pop()
                out.append(
                    Generation(
                        self.tokenizer.decode(ids, skip_special_tokens=True),
                        int(prompt_lengths[row]),
                        len(ids),
                    )
                )
        return out

    def close(self) -> None:
        del self.model
