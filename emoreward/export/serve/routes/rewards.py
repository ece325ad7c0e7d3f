"""``POST /v1/rewards``: descriptions and their media in, one unnormalised reward per description out (with
``truncated``, ``empty``, ``n_tokens`` and the model's name). The schema: docs/serving.md ("Reward server")."""

from __future__ import annotations

from typing import Any

from emoreward.export.serve.batching import Job
from emoreward.export.serve.routes.base import BodyField, Route, register


@register
class Rewards(Route):
    """``{"descriptions": [...], "media": object | [object per description]}`` -> ``{"rewards", "truncated",
    "empty", "n_tokens", "model"}``."""

    path = "/v1/rewards"
    name = "rewards"
    body_fields = (
        BodyField("descriptions", "the texts to reward", role="items", required=True, noun="descriptions"),
        BodyField("media", "each description's subtitle / video / audio", role="per_item_or_object"),
    )

    def parse(self, body: dict) -> Job:
        fields = self.fields
        items = body["descriptions"]
        descriptions = [fields.text(d, f"descriptions[{k}]") for k, d in enumerate(items)]
        contexts = fields.contexts(body["media"], len(descriptions))
        return fields.job(self.name, descriptions, contexts, [f"descriptions[{k}]" for k in range(len(items))])

    def reply(self, job: Job, rewards: list[float], truncated: list[bool], empty: list[bool]) -> dict[str, Any]:
        n_tokens = [int(t) for t in job.info.n_tokens]
        return {
            "rewards": rewards,
            "truncated": truncated,
            "empty": empty,
            "n_tokens": n_tokens,
            "model": self.model_name,
        }
