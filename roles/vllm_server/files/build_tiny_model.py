#!/usr/bin/env python3
"""Fill a model folder that holds only config.json with random weights and a
byte-level BPE tokenizer trained here, so vLLM can serve it with no hub.

Run with the vLLM venv's python (it has torch, transformers and tokenizers).
Idempotent: a folder that already has weights and a tokenizer is left alone;
prints one JSON line {"changed": bool, "path": ..., "bytes": ...}.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

CORPUS_SEED = [
    "the quick brown fox jumps over the lazy dog",
    "a tiny model served by vllm on a cpu",
    "hello world, this is a test of the gateway",
    "pipelines and tensors split the layers across ranks",
    "ray clusters join nodes and gpus before serving",
    "nginx balances requests over the replicas",
    "once upon a time there was a small language model",
    "numbers 0 1 2 3 4 5 6 7 8 9 10 100 1000",
]


def corpus() -> list[str]:
    lines = []
    for i in range(400):
        base = CORPUS_SEED[i % len(CORPUS_SEED)]
        lines.append(f"{base} {i} {base.upper() if i % 3 == 0 else base.title()}.")
    return lines


def main() -> int:
    folder = Path(sys.argv[1])
    config = json.loads((folder / "config.json").read_text())
    done = (folder / "model.safetensors").exists() and (folder / "tokenizer.json").exists()
    if done:
        size = (folder / "model.safetensors").stat().st_size
        print(json.dumps({"changed": False, "path": str(folder), "bytes": size}))
        return 0

    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast
    from transformers.utils import logging as hf_logging

    # Progress bars and deprecation notices go to stderr, which a container's output
    # interleaves with stdout: keep the run quiet so the JSON line stands alone.
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()

    vocab = int(config["vocab_size"])
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<s>", "</s>", "<pad>"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    if tok.get_vocab_size() > vocab:
        raise SystemExit(f"tokenizer has {tok.get_vocab_size()} tokens, config.json allows {vocab}")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    # A chat template so /v1/chat/completions works.
    fast.chat_template = (
        "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>\n{% endfor %}"
        "{% if add_generation_prompt %}<s>assistant: {% endif %}"
    )

    torch.manual_seed(0)
    cfg = AutoConfig.from_pretrained(folder)
    cfg.bos_token_id = tok.token_to_id("<s>")
    cfg.eos_token_id = tok.token_to_id("</s>")
    cfg.pad_token_id = tok.token_to_id("<pad>")
    dtype = getattr(torch, str(config.get("torch_dtype", "bfloat16")))
    # .to(dtype), not a dtype argument: transformers renamed torch_dtype to dtype and warns on the old name.
    model = AutoModelForCausalLM.from_config(cfg).to(dtype)
    # Write to a temporary folder and move the files in: a half-built folder never looks done.
    tmp = folder / ".building"
    tmp.mkdir(exist_ok=True)
    model.save_pretrained(tmp, safe_serialization=True)
    fast.save_pretrained(tmp)
    for item in sorted(tmp.iterdir(), key=lambda p: p.name == "model.safetensors"):
        if item.name == "config.json":
            item.unlink()  # keep the folder's own config.json: the planner read that one
            continue
        item.replace(folder / item.name)
    tmp.rmdir()
    size = (folder / "model.safetensors").stat().st_size
    print(json.dumps({"changed": True, "path": str(folder), "bytes": size}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
