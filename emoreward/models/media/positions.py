"""The one rule for Qwen2.5-VL's 3-D rotary positions (M-RoPE), as the original release and vLLM compute them
(transformers 5.x continues text after a video at another position); training, scoring and the exported
remote-code class all apply it.

This file imports nothing but torch: `emoreward export` copies it verbatim into `modeling_emoreward.py`.
See docs/multimodal.md.
"""

from __future__ import annotations

import torch


POSITION_RULE = "qwen2.5-release"  # recorded in every media model's settings (part of its score-cache keys)


def qwen2_5_vl_positions(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    video_grid_thw: torch.Tensor | None,
    second_per_grid_ts: torch.Tensor | None,
    video_token_id: int,
    image_token_id: int | None = None,
    image_grid_thw: torch.Tensor | None = None,
    spatial_merge_size: int = 2,
    tokens_per_second: float = 2.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """M-RoPE positions of a batch of Qwen2.5-VL sequences, the release / vLLM rule (module docstring).

    Args:
        input_ids (`torch.LongTensor` of shape `(batch, seq_len)`): media placeholders already expanded (one token
            per merged patch), padding on either side.
        attention_mask (`torch.Tensor` of shape `(batch, seq_len)`, *optional*): 1 for real tokens; padded
            positions get 1 (they are never read).
        video_grid_thw (`torch.LongTensor` of shape `(num_videos, 3)`): `(t, h, w)` patch grid of every video, in
            batch and sequence order.
        second_per_grid_ts (`torch.Tensor` of shape `(num_videos,)`): seconds of video per temporal patch
            (`temporal_patch_size / fps`); None counts 1 second.
        video_token_id, image_token_id: the placeholder ids.
        image_grid_thw (`torch.LongTensor` of shape `(num_images, 3)`, *optional*).
        spatial_merge_size, tokens_per_second: `vision_config.spatial_merge_size`, `vision_config.tokens_per_second`.

    Returns:
        `(positions, deltas)`: `torch.LongTensor` of shape `(3, batch, seq_len)` and of shape `(batch, 1)`, where
        `deltas[b] = max position + 1 - number of real tokens` (the shift of text positions after the sequence).

    Raises:
        ValueError: more media runs than grids.
    """
    batch, width = input_ids.shape
    device = input_ids.device
    positions = torch.ones(3, batch, width, dtype=torch.long, device=device)
    deltas = torch.zeros(batch, 1, dtype=torch.long, device=device)
    videos = iter(video_grid_thw.tolist() if video_grid_thw is not None else [])
    seconds = iter(second_per_grid_ts.tolist() if second_per_grid_ts is not None else [])
    images = iter(image_grid_thw.tolist() if image_grid_thw is not None else [])
    for b in range(batch):
        keep = attention_mask[b].bool() if attention_mask is not None else torch.ones(width, dtype=torch.bool)
        ids = input_ids[b][keep.to(device)].tolist()
        parts: list[torch.Tensor] = []
        i = 0
        while i < len(ids):
            token = ids[i]
            is_video = token == video_token_id
            is_image = image_token_id is not None and token == image_token_id
            j = i + 1
            if is_video or is_image:
                grid = next(videos if is_video else images, None)
                if grid is None:
                    raise ValueError(f"sequence {b} has more {'video' if is_video else 'image'} runs than grids")
                t, h, w = int(grid[0]), int(grid[1]) // spatial_merge_size, int(grid[2]) // spatial_merge_size
                step = float(next(seconds, 1.0)) if is_video else 0.0
                start = int(parts[-1].max()) + 1 if parts else 0
                t_index = (torch.arange(t).view(-1, 1).expand(-1, h * w) * step * tokens_per_second).long().flatten()
                h_index = torch.arange(h).view(1, -1, 1).expand(t, -1, w).flatten()
                w_index = torch.arange(w).view(1, 1, -1).expand(t, h, -1).flatten()
                parts.append(torch.stack([t_index, h_index, w_index]) + start)
                j = i + t * h * w
            else:
                while (
                    j < len(ids) and ids[j] != video_token_id and (image_token_id is None or ids[j] != image_token_id)
                ):
                    j += 1
                start = int(parts[-1].max()) + 1 if parts else 0
                parts.append(torch.arange(j - i).view(1, -1).expand(3, -1) + start)
            i = j
        row = torch.cat(parts, dim=1) if parts else torch.zeros(3, 0, dtype=torch.long)
        positions[:, b, keep.to(device)] = row.to(device)
        deltas[b, 0] = (int(row.max()) + 1 if row.numel() else 0) - len(ids)
    return positions, deltas
