"""The one Qwen2.5-VL position rule (`emoreward.models.media.positions`): hand-computed positions, the release /
vLLM rule for text after a video, padding on either side, and the model scoring with it on every path."""

from __future__ import annotations

import torch

from emoreward.models.media.positions import qwen2_5_vl_positions


V, T = 9, 1  # a video placeholder id, a text id


def test_text_after_a_video_continues_past_its_largest_position():
    # 2 text tokens, a video of grid (t=2, h=4, w=4) merged 2x2 -> 2 x 2 x 2 = 8 tokens, then 3 text tokens;
    # 1 s per temporal patch at 2 tokens per second: temporal positions 0 and 2 (plus the start, 2)
    ids = torch.tensor([[T, T] + [V] * 8 + [T, T, T]])
    pos, delta = qwen2_5_vl_positions(
        ids, None, video_grid_thw=torch.tensor([[2, 4, 4]]), second_per_grid_ts=torch.tensor([1.0]),
        video_token_id=V, spatial_merge_size=2, tokens_per_second=2,
    )  # fmt: skip
    t, h, w = pos[:, 0].tolist()
    assert t == [0, 1] + [2, 2, 2, 2, 4, 4, 4, 4] + [5, 6, 7]
    assert h == [0, 1] + [2, 2, 3, 3, 2, 2, 3, 3] + [5, 6, 7]
    assert w == [0, 1] + [2, 3, 2, 3, 2, 3, 2, 3] + [5, 6, 7]
    # the release / vLLM rule: the text after the video starts at 2 + max(4 - 2, 1, 1) + 1 = 5 (transformers 5.x
    # continues at 2 + max(h', w') = 4)
    assert delta.tolist() == [[8 - 13]]


def test_padding_on_either_side_gives_the_same_positions_to_the_real_tokens():
    row = [T] + [V] * 4 + [T, T]
    grids, seconds = torch.tensor([[2, 2, 4], [2, 2, 4]]), torch.tensor([0.5, 0.5])
    kw = dict(video_grid_thw=grids, second_per_grid_ts=seconds, video_token_id=V, spatial_merge_size=2,
              tokens_per_second=25)  # fmt: skip
    right = torch.tensor([row + [0, 0], row[:-1] + [0, 0, 0]])
    left = torch.tensor([[0, 0] + row, [0, 0, 0] + row[:-1]])
    pr, dr = qwen2_5_vl_positions(right, (right != 0).long(), **kw)
    pl, dl = qwen2_5_vl_positions(left, (left != 0).long(), **kw)
    assert torch.equal(pr[:, 0, :7], pl[:, 0, 2:]) and torch.equal(pr[:, 1, :6], pl[:, 1, 3:])
    assert torch.equal(dr, dl)
    # 0.5 s per patch x 25 tokens per second: the second temporal patch at 12 (int(12.5)), text resumes at 1 + 13
    assert pr[0, 0].tolist()[:7] == [0, 1, 1, 13, 13, 14, 15]


def test_the_model_scores_with_the_rule_on_every_path(tiny_backbone_dir):
    """Shared prefix (KV cache continued with the rule's delta), full sequences and a padded batch agree."""
    import numpy as np

    from emoreward.export.hf import synthetic_context
    from emoreward.models.media.model import MediaRewardModel

    model = MediaRewardModel.from_backbone("qwen2.5-vl", str(tiny_backbone_dir("qwen2.5-vl")))
    context = synthetic_context(model, seconds=3.0)
    descriptions = ["happy", "a much longer description of a sad face", " calm"]
    shared = model.score_info(descriptions, context).rewards
    full = model.score_info(descriptions, context, shared_prefix=False).rewards
    np.testing.assert_allclose(shared, full, atol=1e-5)
    prefix = model.encode_prefix(context)
    rule = model.module.positions(torch.tensor([prefix.input_ids]), None, {k: v for k, v in prefix.media.items()})
    assert rule is not None and int(rule[1]) < 0  # the prefix's video shifts the text positions
