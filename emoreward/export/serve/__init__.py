"""The reward server, split the way vLLM splits an endpoint (the command itself is `emoreward serve`):

- `protocol`: endpoints, request / response schemas, limits (`ServerLimits`), strict JSON, `RequestError` and the
  error codes, bearer authentication: shared by every engine;
- `openrlhf`: OpenRLHF's decoded queries -> the descriptions the policy wrote;
- `service`: `RewardService`, the serving logic without HTTP (parse, score, reply);
- `batching`: `Job` and `Batcher`, the bounded queue and the scoring thread;
- `http`: `RewardServer`, HTTP/1.1 on one asyncio event loop (a protocol per connection, parsed and framed by
  h11), authentication, lifecycle.
"""
