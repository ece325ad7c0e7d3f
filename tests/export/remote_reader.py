"""A reader of an export with nothing but transformers: run as a script in a subprocess whose imports cannot reach
emoreward (a meta-path finder refuses the name), it loads the export with
`AutoModelForSequenceClassification.from_pretrained(export, trust_remote_code=True)` and writes `logits[:, 0]` of
the batch in a safetensors file as JSON.

    python remote_reader.py EXPORT INPUTS.safetensors OUT.json DTYPE [native]

`native`: transformers' own class, `trust_remote_code=False` (exports of `BackboneSpec.native_classifier`).

INPUTS holds `input_ids`, `attention_mask` and the media tensors, batched (the caller pads on the side it tests).
"""

import importlib.abc
import json
import sys


class _NoEmoreward(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "emoreward" or name.startswith("emoreward."):
            raise ModuleNotFoundError(f"the remote-code reader must not import {name}")
        return None


def main(export: str, inputs: str, out: str, dtype: str, mode: str = "remote") -> None:
    sys.meta_path.insert(0, _NoEmoreward())
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForSequenceClassification

    model, info = AutoModelForSequenceClassification.from_pretrained(
        export, trust_remote_code=mode != "native", dtype=getattr(torch, dtype), output_loading_info=True
    )
    batch = load_file(inputs)
    with torch.no_grad():
        logits = model.eval()(**batch).logits
    report = {
        "rewards": logits[:, 0].double().tolist(),
        "class": type(model).__name__,
        "missing_keys": sorted(info["missing_keys"]),
        "unexpected_keys": sorted(info["unexpected_keys"]),
        "emoreward_imported": any(m == "emoreward" or m.startswith("emoreward.") for m in sys.modules),
    }
    with open(out, "w", encoding="utf-8") as fh:
        json.dump(report, fh)


if __name__ == "__main__":
    main(*sys.argv[1:6])
