"""``POST /v1/rewards``: descriptions and their media in, one unnormalised reward per description out (with
``truncated``, ``empty``, ``n_tokens`` and the model's name). The schema: docs/serving.md ("Reward server")."""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from emoreward.export.serve.batching import Job
from emoreward.export.serve.protocol import RequestError
from emoreward.export.serve.routes.base import Route, register


@register
class Rewards(Route):
    """``{"descriptions": [...], "media": object | [object per description]}`` -> ``{"rewards", "truncated",
    "empty", "n_tokens", "model"}``."""

    path = "/v1/rewards"
    name = "rewards"

    def parse(self, body: dict) -> Job:
        fields = self.fields
        unknown = sorted(set(body) - {"descriptions", "media"})
        if unknown:
            raise RequestError(HTTPStatus.BAD_REQUEST, f"unknown fields {unknown}; expected 'descriptions', 'media'")
        if "descriptions" not in body:
            raise RequestError(HTTPStatus.BAD_REQUEST, "missing field 'descriptions'")
        items = fields.items(body["descriptions"], "descriptions")
        descriptions = [fields.text(d, f"descriptions[{k}]") for k, d in enumerate(items)]
        contexts = fields.contexts(body.get("media"), len(descriptions))
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
