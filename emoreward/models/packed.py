"""The scoring forward of BERT-family value-head encoders on CPU (`PackedEncoder`): what
`BertForSequenceClassification.forward` computes in eval mode with less work, rewards equal to float rounding.
See docs/ranking.md and docs/speed.md.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F


logger = logging.getLogger(__name__)

CLS_ROWS = 32  # the [CLS] stage's row count is a multiple of this (few distinct shapes; 32 rows cost nothing)


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


class PackedEncoder:
    """Eval-mode forward of a `BertForSequenceClassification` network that computes only what its value head reads:
    the last layer for `[CLS]` only (keys and values for every token), exact attention widths with filler rows up to
    `row_multiple` (few distinct shapes for oneDNN), fused query / key / value projections and, in bfloat16 on CPU,
    oneDNN's fused linear (`torch.ops.mkldnn._linear_pointwise`) with the exact (erf) GELU.

    Args:
        network: the network (eval mode; used as it is, its query, key and value weights concatenated once into a
            copy; `network` is unchanged).
        row_multiple: token rows of a batch are followed by filler rows up to a multiple of this (1 = none)."""

    def __init__(self, network: torch.nn.Module, row_multiple: int = 1):
        self.network = network
        self.row_multiple = max(1, int(row_multiple))
        bert = network.bert
        self.embeddings = bert.embeddings
        self.layers = list(bert.encoder.layer)
        attention = self.layers[0].attention.self
        self.heads, self.head_dim = attention.num_attention_heads, attention.attention_head_size
        self.hidden = self.heads * self.head_dim
        with torch.no_grad():
            self.qkv = [
                (
                    torch.cat([a.query.weight, a.key.weight, a.value.weight]).contiguous(),
                    torch.cat([a.query.bias, a.key.bias, a.value.bias]).contiguous(),
                )
                for a in (layer.attention.self for layer in self.layers)
            ]
        self.token_type = self.embeddings.token_type_embeddings.weight[0]
        self.pad_id = network.config.pad_token_id or 0
        self.fused = _fused_linear_works(self.token_type)
        act = self.layers[0].intermediate.intermediate_act_fn
        self.fuse_gelu = self.fused and getattr(act, "act", None) is F.gelu  # the exact (erf) GELU only

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, gelu: bool = False) -> torch.Tensor:
        """`x @ weight.T + bias` (then the exact GELU), fused in oneDNN where that works."""
        if self.fused:
            return torch.ops.mkldnn._linear_pointwise(
                x, weight, bias, "gelu" if gelu else "none", [], "none" if gelu else ""
            )
        out = F.linear(x, weight, bias)
        return F.gelu(out) if gelu else out

    def __call__(self, sequences: Sequence[Sequence[int]], width: int | None = None) -> torch.Tensor:
        """Value-head logits (shape `(B, num_labels)`, the network's dtype) of `B` token-id sequences (each starting with
        `[CLS]`) at attention `width` (default: the longest)."""
        device = self.token_type.device
        lengths = np.fromiter((len(s) for s in sequences), dtype=np.int64, count=len(sequences))
        n_rows = len(lengths)
        width = max(int(width or 0), int(lengths.max()))
        n_slots = n_rows * width
        stream = _round_up(n_slots, self.row_multiple)
        ids = np.full(stream, self.pad_id, dtype=np.int64)
        grid = ids[:n_slots].reshape(n_rows, width)
        for row, seq in enumerate(sequences):
            grid[row, : len(seq)] = seq
        positions = np.zeros(stream, dtype=np.int64)
        positions[:n_slots] = np.tile(np.arange(width), n_rows)
        mask = None  # a batch of equal lengths needs none
        if (lengths < width).any():
            mask = torch.from_numpy(np.arange(width)[None, :] < lengths[:, None]).to(device)[:, None, None, :]
        cls_rows = _round_up(n_rows, CLS_ROWS) if self.row_multiple > 1 else n_rows
        heads, head_dim, hidden = self.heads, self.head_dim, self.hidden

        emb = self.embeddings
        x = emb.word_embeddings(torch.from_numpy(ids).to(device))
        x = x + self.token_type
        x = x + emb.position_embeddings(torch.from_numpy(positions).to(device))
        x = emb.LayerNorm(x)

        def heads_of(t: torch.Tensor, parts: int):  # (stream, parts * hidden) -> `parts` x (B, H, width, D)
            return t[:n_slots].view(n_rows, width, parts, heads, head_dim).permute(2, 0, 3, 1, 4)

        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            weight, bias = self.qkv[i]
            attention_out, inner, outer = layer.attention.output, layer.intermediate, layer.output
            if i < last:
                q, k, v = heads_of(self.linear(x, weight, bias), 3)
                context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape(-1, hidden)
                if stream > n_slots:
                    context = torch.cat([context, x.new_zeros(stream - n_slots, hidden)])
                residual = x
            else:  # the head reads [CLS] only: its query, attention and feed-forward alone
                k, v = heads_of(self.linear(x, weight[hidden:], bias[hidden:]), 2)
                residual = x.new_zeros(cls_rows, hidden)
                residual[:n_rows] = x[:n_slots:width]
                q = self.linear(residual, weight[:hidden], bias[:hidden])[:n_rows]
                q = q.view(n_rows, 1, heads, head_dim).transpose(1, 2)
                context = x.new_zeros(cls_rows, hidden)
                context[:n_rows] = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).reshape(n_rows, hidden)
            h = attention_out.LayerNorm(
                self.linear(context, attention_out.dense.weight, attention_out.dense.bias) + residual
            )
            if self.fuse_gelu:
                up = self.linear(h, inner.dense.weight, inner.dense.bias, gelu=True)
            else:
                up = inner.intermediate_act_fn(self.linear(h, inner.dense.weight, inner.dense.bias))
            x = outer.LayerNorm(self.linear(up, outer.dense.weight, outer.dense.bias) + h)
        pooler = self.network.bert.pooler
        pooled = pooler.activation(self.linear(x, pooler.dense.weight, pooler.dense.bias))
        return self.network.classifier(pooled)[:n_rows]


def _fused_linear_works(reference: torch.Tensor) -> bool:
    """Whether oneDNN's fused linear (`torch.ops.mkldnn._linear_pointwise`) is available for this device and dtype
    and gives `F.linear`'s result (bfloat16 on CPU only: float32 stays on MKL, which needs no per-shape set-up)."""
    if reference.device.type != "cpu" or reference.dtype != torch.bfloat16:
        return False
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return False
    try:
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(8, 16, generator=generator).to(reference.dtype)
        w = torch.randn(24, 16, generator=generator).to(reference.dtype)
        b = torch.randn(24, generator=generator).to(reference.dtype)
        with torch.inference_mode():
            got = torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")
            want = F.linear(x, w, b)
        return bool(torch.allclose(got.float(), want.float(), atol=0.1, rtol=0.02))
    except (RuntimeError, NotImplementedError) as err:  # an op missing from this torch build
        logger.debug("oneDNN fused linear unavailable (%s); using F.linear", err)
        return False


def packed_encoder(network: torch.nn.Module, row_multiple: int = 1) -> PackedEncoder | None:
    """A `PackedEncoder` for `network` when it reproduces it (`BertForSequenceClassification` in eval mode on CPU,
    absolute positions, no decoder, cross-attention or chunked feed-forward, a pooler and a Linear classifier), else
    None."""
    from transformers import BertForSequenceClassification

    if type(network) is not BertForSequenceClassification or network.training:
        return None
    config = network.config
    if (
        next(network.parameters()).device.type != "cpu"
        or getattr(config, "position_embedding_type", "absolute") != "absolute"
        or config.is_decoder
        or getattr(config, "add_cross_attention", False)
        or getattr(config, "chunk_size_feed_forward", 0)
        or network.bert.pooler is None
        or not isinstance(network.classifier, torch.nn.Linear)
    ):
        return None
    return PackedEncoder(network, row_multiple)


__all__ = ["CLS_ROWS", "PackedEncoder", "packed_encoder"]
