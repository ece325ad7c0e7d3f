"""Experiment tracking: W&B set up from the environment, one run per fold and one for the final fit in a group,
the resolved recipe (no secrets) as config, harness metrics as tables and images. See docs/training.md.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

from emoreward.evaluation.report import headline, plot_confusion
from emoreward.training.applicability import logs_to_wandb
from emoreward.training.config import EmoRewardConfig, public_config


logger = logging.getLogger(__name__)


def wandb_enabled(config: EmoRewardConfig) -> bool:
    """Whether the run logs to W&B (`emoreward.training.applicability.logs_to_wandb`, which the W&B fields' check
    reads too)."""
    return logs_to_wandb(config)


def configure_wandb(config: EmoRewardConfig) -> str | None:
    """Prepare W&B from the environment, never from the recipe: with no API key (neither `WANDB_API_KEY` nor
    a `wandb login` entry) the run logs offline instead of failing. `WANDB_*` variables set by the user win.

    Returns the W&B mode in effect, or None when W&B is not in `report_to`.
    """
    if not wandb_enabled(config):
        return None
    os.environ.setdefault("WANDB_PROJECT", config.wandb_project)
    os.environ.setdefault("WANDB_DIR", str(Path(config.output_dir).resolve()))
    Path(os.environ["WANDB_DIR"]).mkdir(parents=True, exist_ok=True)
    if "WANDB_MODE" not in os.environ and not has_wandb_key():
        os.environ["WANDB_MODE"] = "offline"
        logger.info(  # the main job prints where the offline runs are
            "no W&B API key found: logging offline to %s (sync later with `wandb sync`)", os.environ["WANDB_DIR"]
        )
    os.environ.setdefault(
        "WANDB_LOG_MODEL", "false"
    )  # the model artifact is ours (`wandb_log_model`), not the Trainer's
    os.environ.setdefault("WANDB_SILENT", "true")  # no banner, history and sync hints per run (200 lines for 5 folds)
    return os.environ.get("WANDB_MODE", "online")


def start_wandb_run(config: EmoRewardConfig, *, name: str, job_type: str, group: str, kind: str) -> None:
    """Start the W&B run of one fold or of the final fit on the main process, before its trainer starts: `group` ties
    the runs of one job together, `job_type` is "fold" or "final", the config is the resolved recipe without secrets.
    `WANDB_*` variables set by the user win."""
    import wandb

    if config.process_index != 0:
        return
    if wandb.run is not None:
        wandb.finish()
    user_tags = [t for t in os.environ.get("WANDB_TAGS", "").split(",") if t.strip()]
    wandb.init(
        project=os.environ.get("WANDB_PROJECT") or config.wandb_project,
        name=name,
        group=os.environ.get("WANDB_RUN_GROUP") or group,
        job_type=os.environ.get("WANDB_JOB_TYPE") or job_type,
        config=public_config(config),
        tags=list(dict.fromkeys([*user_tags, *wandb_tags(config, kind)])),
        dir=os.environ.get("WANDB_DIR"),
    )


def log_model_artifact(model_dir: str | Path, name: str, metadata: dict | None = None) -> str | None:
    """Log a saved model directory as a W&B artifact of type "model" (alias "final") on the active run; returns
    the artifact name, or None when no run is active (W&B off, or not the main process)."""
    import re

    import wandb

    if wandb.run is None:
        return None
    artifact_name = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "emoreward-model"
    artifact = wandb.Artifact(artifact_name, type="model", metadata=metadata or {})
    artifact.add_dir(str(model_dir))
    wandb.run.log_artifact(artifact, aliases=["final"])
    return artifact_name


def has_wandb_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        import netrc

        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


def log_evaluation(
    evaluation: dict,
    prefix: str = "harness",
    *,
    config: EmoRewardConfig | None = None,
    kind: str = "",
    title: str = "",
) -> None:
    """Log one harness evaluation to the active W&B run (the main process's; other processes have none): the
    headline metrics as scalars and as a table (judge beside the baselines), the three-class confusion matrix
    and the reward histogram as images, and tags naming the run's kind and setup (added to `WANDB_TAGS`)."""
    import tempfile

    import wandb

    if wandb.run is None:
        return
    rows = headline(evaluation)
    flat = {f"{prefix}/{column}/{k}": v for column, row in rows.items() for k, v in row.items() if v is not None}
    metrics = list(dict.fromkeys(k for row in rows.values() for k in row))
    table = wandb.Table(columns=["metric", *rows], data=[[m, *(rows[c].get(m) for c in rows)] for m in metrics])
    media = {f"{prefix}/metrics": table}
    with tempfile.TemporaryDirectory() as tmp:
        three = evaluation["judge"]["three_class"]
        cm_path = plot_confusion(
            three["confusion"], three["labels"], three["pred_labels"], Path(tmp) / "confusion.png", title=title
        )
        media[f"{prefix}/confusion_matrix"] = wandb.Image(str(cm_path))
        if "pair_rewards" in evaluation:
            hist_path = plot_reward_histogram(evaluation["pair_rewards"], Path(tmp) / "rewards.png", title=title)
            media[f"{prefix}/reward_histogram"] = wandb.Image(str(hist_path))
        wandb.log({**flat, **media})
    wandb.run.summary.update(flat)
    if config is not None:
        wandb.run.tags = tuple(dict.fromkeys([*(wandb.run.tags or ()), *wandb_tags(config, kind)]))


def wandb_tags(config: EmoRewardConfig, kind: str) -> list[str]:
    """Tags of a run: the project, the run's kind, backbone, tie handling and how it was distributed."""
    backbone = Path(getattr(config, "backbone", None) or config.model_name_or_path).name[:48]  # a judge: its LM
    tags = ["emoreward", f"backbone:{backbone}", f"ties:{config.ties}", f"world_size:{config.world_size}"]
    if config.deepspeed or os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
        tags.append("deepspeed")
    return tags + ([kind] if kind else [])


def plot_reward_histogram(pair_rewards: dict, path: Path, title: str = "") -> Path:
    """Histogram of the rewards of both descriptions of every pair, and of the differences r1 - r2."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    r1, r2 = np.asarray(pair_rewards["reward_1"]), np.asarray(pair_rewards["reward_2"])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(8, 3))
    ax1.hist(np.concatenate([r1, r2]), bins=30)
    ax1.set_xlabel("reward r(description)")
    ax2.hist(r1 - r2, bins=30)
    ax2.set_xlabel("r1 - r2")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def finish_wandb() -> None:
    import wandb

    if wandb.run is not None:
        wandb.finish()
