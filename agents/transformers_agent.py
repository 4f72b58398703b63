"""An agent around a local causal LM: ``AutoModelForCausalLM.from_pretrained(path)`` and its chat template.

Free text: prompts of a batch are rendered with the tokenizer's chat template
(``add_generation_prompt=True``), left-padded (so every row's generation starts at the same position) and
generated together in chunks of ``batch_size`` rows. Sampling uses one ``torch.Generator``-free seed per
chunk (``torch.manual_seed`` with the first row's seed): a run is reproducible for the same batching; greedy
decoding (``temperature=0``) is reproducible regardless.

Guided (:class:`~agents.base.AnswerMode`): the model chooses among the step's answers
(:func:`agents.base.guided_answers`, each followed by the end-of-turn token, so that ``go to cabinet 1`` is
not a free prefix of ``go to cabinet 10``) by the probability it gives each whole answer,

    log p(a | prompt) = sum_t log p(a_t | prompt, a_<t)

the argmax at ``temperature=0``, else a draw from ``p(a)^(1/T)`` renormalised over the answers (at ``T=1`` the
model's own distribution given that it answers admissibly: what the trainer's constrained decoding samples,
token by token). A sum, not a per-token mean: it is the probability of writing the answer, which a small
model puts on short answers (docs/real_models.md). The prompt and the tokens every answer starts with
(``<think></think><action>``: the same term in every sum) go through the model once; the rest of the
answers, ``batch_size`` rows at a time, continue from its key/value cache repeated over the rows. A draw is
seeded per (task, episode seed, step), so it does not depend on batching.

The model computes on ``threads`` CPU threads (``torch.set_num_threads``): on 2 cores a second thread buys
nothing (``benchmarks/results/real_model.json``, ``threads``), and on a busy machine it slows decoding down.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from agents.base import AnswerMode, Chat, Generation, PromptConfig, PromptedAgent
from agents.llm_config import TransformersConfig


def default_threads() -> int:
    """CPU threads when ``threads`` is unset: half the CPUs this process may run on, at least one (one on a
    2-core machine; hyper-threads and a busy machine's other work get the rest)."""
    return max(1, len(os.sched_getaffinity(0)) // 2)


class TransformersAgent(PromptedAgent):
    """A :class:`~agents.base.PromptedAgent` generating with a local transformers model.

    Args:
        config: Model path, device, sampling, threads.
        prompt_config: Prompt template, history length, length bound.
        mode: :class:`~agents.base.AnswerMode` value: free text, or guided by the model's log-probabilities.
    """

    def __init__(
        self,
        config: TransformersConfig,
        prompt_config: PromptConfig | None = None,
        mode: str = AnswerMode.FREE.value,
    ):
        super().__init__(prompt_config, mode)
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if config.threads is not None and config.threads < 1:
            raise ValueError(f"transformers.threads must be >= 1, got {config.threads}")
        self.config = config
        self.torch = torch
        self.device = torch.device(config.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if self.device.type == "cpu":
            torch.set_num_threads(config.threads or default_threads())
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

    def _prompt_text(self, prompt: Chat) -> str:
        return self.tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)

    def generate(
        self, prompts: Sequence[Chat], seeds: Sequence[int], choices: Sequence[Sequence[str]] | None = None
    ) -> list[Generation]:
        if choices is not None:
            return [self.choose(p, c, seed) for p, c, seed in zip(prompts, choices, seeds, strict=True)]
        torch, config = self.torch, self.config
        texts = [self._prompt_text(p) for p in prompts]
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

    def answer_scores(self, prompt: Chat, answers: Sequence[str]) -> list[float]:
        """``log p(answer + end of turn | prompt)`` of each answer, less the log-probability of the tokens
        they all start with (the same for every answer; see the module docstring)."""
        torch, tokenizer = self.torch, self.tokenizer
        prompt_ids = tokenizer(
            self._prompt_text(prompt),
            truncation=True,
            max_length=self.config.max_prompt_tokens,
            add_special_tokens=False,
        )["input_ids"]
        end = tokenizer.eos_token or ""
        candidates = [tokenizer(a + end, add_special_tokens=False)["input_ids"] for a in answers]
        shared = _shared_prefix_length(candidates)
        prefix = torch.tensor([prompt_ids + candidates[0][:shared]], device=self.device)
        scores: list[float] = []
        with torch.inference_mode():
            context = self.model(input_ids=prefix, use_cache=True)
            first = torch.log_softmax(
                context.logits[0, -1].float(), dim=-1
            )  # predicts every tail's 1st token
            cache = context.past_key_values
            tails = [c[shared:] for c in candidates]
            for start in range(0, len(tails), self.config.batch_size):
                rows = tails[start : start + self.config.batch_size]
                width = max(len(t) for t in rows)
                # right-padded: a real token never attends to the padding after it (causal attention)
                ids = torch.full((len(rows), width), tokenizer.pad_token_id, device=self.device)
                for r, tail in enumerate(rows):
                    ids[r, : len(tail)] = torch.tensor(tail, device=self.device)
                cache.batch_repeat_interleave(len(rows))
                logits = self.model(input_ids=ids, past_key_values=cache, use_cache=True).logits
                cache.crop(-width)  # back to the shared context, one row
                cache.batch_select_indices(torch.tensor([0], device=self.device))
                logprobs = torch.log_softmax(logits[:, :-1].float(), dim=-1)
                for r, tail in enumerate(rows):
                    positions = torch.arange(len(tail) - 1)
                    later = logprobs[r, positions, torch.tensor(tail[1:], dtype=torch.long)].sum()
                    scores.append(float(first[tail[0]] + later))
        return scores

    def choose(self, prompt: Chat, answers: Sequence[str], seed: int = 0) -> Generation:
        """The model's answer among ``answers`` (:meth:`answer_scores`): the most probable at temperature 0
        (the first on a tie), else drawn with ``seed`` from the scores over the temperature, softmaxed."""
        torch, temperature = self.torch, self.config.temperature
        scores = self.answer_scores(prompt, answers) if len(answers) > 1 else [0.0]  # one answer: no choice
        if temperature > 0:
            weights = torch.softmax(torch.tensor(scores, dtype=torch.float64) / temperature, dim=0)
            generator = torch.Generator().manual_seed(int(seed))
            chosen = int(torch.multinomial(weights, 1, generator=generator))
        else:
            chosen = max(range(len(answers)), key=scores.__getitem__)
        prompt_tokens = len(self.tokenizer(self._prompt_text(prompt), add_special_tokens=False)["input_ids"])
        answer_tokens = len(self.tokenizer(answers[chosen], add_special_tokens=False)["input_ids"])
        return Generation(answers[chosen], min(prompt_tokens, self.config.max_prompt_tokens), answer_tokens)

    def close(self) -> None:
        del self.model


def _shared_prefix_length(sequences: Sequence[Sequence[int]]) -> int:
    """Tokens every sequence starts with, leaving at least one token of each to score.

    Example:
        >>> _shared_prefix_length([[1, 2, 3, 9], [1, 2, 4, 9], [1, 2, 3, 5, 9]])
        2
        >>> _shared_prefix_length([[1, 2], [1, 2, 3]])
        1
    """
    shortest = min(len(s) for s in sequences)
    length = 0
    while length < shortest - 1 and len({s[length] for s in sequences}) == 1:
        length += 1
    return length
