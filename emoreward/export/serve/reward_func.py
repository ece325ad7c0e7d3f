"""OpenRLHF's Python-file reward route: this file, given as OpenRLHF's remote reward URL, scores every sample with
an emoreward reward model inside the rollout process (no server):

    export EMOREWARD_RM_MODEL=outputs/minilm-lora-rm/model     # the reward-model directory
    python -m openrlhf.cli.train_ppo_ray ... \\
        --reward.remote_url $(python -c "import emoreward.export.serve.reward_func as m; print(m.__file__)")
        # OpenRLHF < 0.10.4: --remote_rm_url <the same path>; the sample's subtitle / clip: --data.label_key

OpenRLHF calls ``reward_func([query], [prompt], [label])`` once per sample from many threads; the one in-process
scorer (`local.shared_batcher`) loads the model once and scores concurrent calls together, with the decoding and
context of ``POST /get_reward``. Settings are environment variables (`reward_func`). See docs/serving.md#openrlhf.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from emoreward.export.serve.routes.openrlhf import ENV_LABELS, ENV_MARKERS  # noqa: F401  (the file's variables)


ENV_MODEL, ENV_MEDIA_ROOT, ENV_BATCH_SIZE = "EMOREWARD_RM_MODEL", "EMOREWARD_RM_MEDIA_ROOT", "EMOREWARD_RM_BATCH_SIZE"
ENV_VLLM_URL = "EMOREWARD_RM_VLLM_URL"
ENV_PREFIX = "EMOREWARD_RM_"
MAX_BATCH_SIZE = 2**31 - 1  # as serve's --batch-size


def environment_settings(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The reward file's settings from the environment, every ``EMOREWARD_RM_*`` variable checked in this one place
    before the model loads: `shared_batcher`'s keywords (``model``, ``media_root``, ``vllm_url``, ``batch_size`` and
    each route option by its `RouteOption.env`, values as ``emoreward serve`` takes them).

    Raises:
        ValueError: one line naming the variable: ``EMOREWARD_RM_MODEL`` unset, an unknown ``EMOREWARD_RM_*``
            variable (a misspelling would be ignored; the known ones listed), a batch size that is not an integer
            in [1, 2**31 - 1], a value outside a route option's choices.
    """
    from emoreward.export.serve import routes

    environ = os.environ if environ is None else environ
    by_env = {option.env: option for option in routes.options().values() if option.env}
    known = [ENV_MODEL, ENV_MEDIA_ROOT, ENV_BATCH_SIZE, ENV_VLLM_URL, *by_env]
    unknown = sorted(name for name in environ if name.startswith(ENV_PREFIX) and name not in known)
    if unknown:
        raise ValueError(f"unknown setting {unknown[0]} (the OpenRLHF reward file reads {', '.join(sorted(known))})")
    model = environ.get(ENV_MODEL)
    if not model:
        raise ValueError(f"set {ENV_MODEL} to the reward-model directory this OpenRLHF reward file scores with")
    raw = environ.get(ENV_BATCH_SIZE, "64").strip()
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_BATCH_SIZE:
        raise ValueError(f"{ENV_BATCH_SIZE}={raw}: expected an integer in [1, {MAX_BATCH_SIZE:,}]")
    settings: dict[str, Any] = {
        "model": model,
        "media_root": environ.get(ENV_MEDIA_ROOT) or None,
        "vllm_url": environ.get(ENV_VLLM_URL) or None,
        "batch_size": int(raw),
    }
    for env, option in by_env.items():
        value = environ.get(env)
        if option.repeat:
            settings[option.name] = tuple((value or "").split())
        else:
            settings[option.name] = option.default if value is None else value
    routes.settings({o.name: settings[o.name] for o in by_env.values()}, settings_in="environment")  # the choices
    return settings


def reward_func(queries: list[str], prompts: list[str], labels: list[Any], **kwargs: Any) -> dict[str, Any]:
    """Rewards of OpenRLHF samples (its ``reward_func`` contract).

    Args:
        queries: ``tokenizer.decode(prompt_ids + response_ids, skip_special_tokens=False)`` per sample.
        prompts: the prompt of each sample (removed from the query; its ``Subtitle:`` line is the context).
        labels: the ``--data.label_key`` value of each sample (see ``EMOREWARD_RM_LABELS``); None when unset.
        **kwargs: ignored (OpenRLHF may pass more in future versions).

    Settings (environment variables: OpenRLHF passes nothing else to the file):
        EMOREWARD_RM_MODEL: the reward-model directory (required).
        EMOREWARD_RM_LABELS: what the labels are: ``ignore`` (default), ``subtitle``, or ``clip`` (a sample id, a
            media path under the media root, or an object; `openrlhf.clip_from_label`).
        EMOREWARD_RM_MEDIA_ROOT: the only folder media paths may point into (multimodal models, ``clip`` labels).
        EMOREWARD_RM_QUERY_MARKERS: the policy's special-token strings to strip from queries when they are not
            among `openrlhf.DEFAULT_QUERY_MARKERS` (separated by spaces).
        EMOREWARD_RM_BATCH_SIZE: most sequences per forward pass (default 64).
        EMOREWARD_RM_VLLM_URL: score through the vLLM server at this URL that serves EMOREWARD_RM_MODEL (an export
            folder) instead of loading the model in the process (`emoreward.export.vllm`).

    Returns:
        ``{"rewards": Tensor (n,), "scores": Tensor (n,), "extra_logs": {name: Tensor (n,)}}``: float32 tensors,
        the reward r(description | context) per sample, as ``/get_reward`` replies (``extra_logs``: the reward,
        and 0/1 flags for a description cut to ``max_length`` tokens or empty).

    Raises:
        ValueError: a setting is unset, unknown or out of range (`environment_settings`, naming the variable), or a
            sample cannot be scored (the message names it, as the server's 400 would).
    """
    import torch

    from emoreward.export.serve.local import score_request, shared_batcher
    from emoreward.export.serve.protocol import RequestError

    settings = environment_settings()
    batcher = shared_batcher(
        settings.pop("model"),
        **settings,
        settings_in="environment",  # an error names EMOREWARD_RM_LABELS, not the server's option
    )
    # a field passed as None (forks pass None for absent references) is absent, as it is on /get_reward
    fields = {"query": queries, "prompts": prompts, "labels": labels}
    body = {key: list(value) for key, value in fields.items() if value is not None}
    try:
        reply = score_request("openrlhf", body, batcher)
    except RequestError as err:
        raise ValueError(f"emoreward reward_func: {err.message}") from None
    return {
        "rewards": torch.tensor(reply["rewards"], dtype=torch.float32),
        "scores": torch.tensor(reply["scores"], dtype=torch.float32),
        "extra_logs": {key: torch.tensor(value, dtype=torch.float32) for key, value in reply["extra_logs"].items()},
    }
