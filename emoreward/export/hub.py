"""Push a saved or exported reward model to the Hugging Face Hub (a model repository), with its model card.

The card (`README.md`, written by `emoreward train` / `emoreward export`) carries the Hub's YAML front matter
(`library_name`, `base_model`, `license`, `datasets`, `pipeline_tag`, `tags`). The token comes from the
environment (`HF_TOKEN`) or `hf auth login`, never from a recipe or a command line, and is never logged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from emoreward.data.records import HubPushError, check_hub_push
from emoreward.models.base import load_settings


# files of a model directory that are bookkeeping of the run that wrote it, not part of the model
NOT_PUSHED = ["finished.json", "*.tmp", ".*"]


def push_reward_model(
    directory: str | Path,
    repo_id: str,
    *,
    private: bool = True,
    revision: str | None = None,
    token: str | None = None,
    commit_message: str | None = None,
) -> Any:
    """Upload a reward-model directory (adapter or merged weights, settings, tokenizer, model card) to the Hub.

    Args:
        directory: a directory written by `emoreward train` (`<output_dir>/model`) or `emoreward export`.
        repo_id: `OWNER/NAME` of the model repository (created if missing).
        private: create the repository private (the default: the bundled training data is non-commercial).
        revision: the branch to push to; None: the default branch.
        token: a Hub token; None: `HF_TOKEN` or the logged-in user's. Never logged.
        commit_message: the commit message (default: names the model kind and backbone).

    Returns:
        The `huggingface_hub.CommitInfo` of the upload.

    Raises:
        FileNotFoundError: `directory` is not an emoreward model directory.
        ValueError: it has no model card with Hub front matter.
        HubPushError: offline (`HF_HUB_OFFLINE=1`), no token (`check_hub_push`), or the Hub refused or could not be reached (one line).
    """
    from huggingface_hub import HfApi

    directory = Path(directory)
    settings = load_settings(directory)
    card = directory / "README.md"
    if not card.exists() or not card.read_text(encoding="utf-8").startswith("---\n"):
        raise ValueError(f"{directory}: no model card with Hub front matter (README.md); save it with emoreward")
    check_hub_push(repo_id, "model", token)
    message = commit_message or f"emoreward {settings.kind} reward model ({settings.backbone})"
    api = HfApi(token=token)
    try:
        api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
        return api.upload_folder(
            folder_path=str(directory),
            repo_id=repo_id,
            repo_type="model",
            revision=revision,
            commit_message=message,
            ignore_patterns=NOT_PUSHED,
        )
    except Exception as err:  # transport and Hub errors: one line, no traceback, no token
        text = " ".join(str(err).split())[:300]
        raise HubPushError(f"cannot push to the Hub model {repo_id!r}: {type(err).__name__}: {text}") from None


__all__ = ["NOT_PUSHED", "push_reward_model"]
