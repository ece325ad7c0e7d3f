"""Repairs the vLLM CPU virtual environment after `pip install -r configs/vllm/requirements.txt` (run with its
python; `make install-vllm` does): the registry's torchaudio and torchcodec are CUDA builds that fail beside the CPU
torch (removed: vLLM runs without them, and `soundfile` reads WAV audio), and torchvision's CUDA build cannot load
its C ops, whose fake-op registrations then fail at import: they are made conditional on the ops being loaded (the
ops, NMS and ROI pooling, are not used by vLLM's media processing; torchvision's transforms are plain torch). The
script then imports vllm and torchvision, so a broken environment fails here, not in the first server start."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path


REMOVE = ("torchaudio", "torchcodec")
FAKE = "@torch.library.register_fake("
GUARDED = "@(lambda *a: torch.library.register_fake(*a) if torchvision.extension._has_ops() else (lambda fn: fn))("


def main() -> int:
    present = [name for name in REMOVE if importlib.util.find_spec(name) is not None]
    if present:
        subprocess.run([sys.executable, "-m", "pip", "uninstall", "-q", "-y", *present], check=True)
    spec = importlib.util.find_spec("torchvision")
    if spec is not None and spec.origin:
        meta = Path(spec.origin).with_name("_meta_registrations.py")
        text = meta.read_text()
        if FAKE in text:
            meta.write_text(text.replace(FAKE, GUARDED))
    subprocess.run([sys.executable, "-c", "import torchvision, vllm.entrypoints.openai.api_server"], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
