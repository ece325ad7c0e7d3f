"""The reward server, split the way vLLM splits an endpoint (the command itself is `emoreward serve`): `protocol`
(schemas, limits, errors, auth), `routes` (the wire routes as objects), `service` (`RewardService`: parse, score,
reply; no HTTP), `batching` (`Job`, `Batcher`), `http` (`RewardServer` on h11 and asyncio), `ray` (Ray Serve),
`worker` (the model process), `local` (the in-process scorer). See docs/serving.md.
"""
