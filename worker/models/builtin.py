"""The built-in model kinds: ``mlp``, ``resnet`` (an image-to-image generator),
``transformer`` (GPT blocks) and ``densenet``, each a stem, a chain of identical blocks and
a head (:class:`~ckptlab.worker.models.base.Chain`), with synthetic batches."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ckptlab.spec.models import DenseNetSpec, MLPSpec, ResNetSpec, TransformerSpec
from ckptlab.worker.models.base import N_CLASSES, Batch, Built, Chain, default_loss

__all__ = ["build_densenet", "build_mlp", "build_resnet", "build_transformer"]


def build_mlp(spec: MLPSpec) -> Built:
    """MLP of :class:`ckptlab.spec.models.MLPSpec`. Inputs ``(B, width)``, targets ``(B,)`` in
    ``[0, 10)``. Each block retains one ``(B, width)`` activation (the ReLU output, also the
    next Linear's saved input) plus a dropout mask when ``dropout > 0``."""
    w = spec.width

    def block() -> nn.Sequential:
        layers: list[nn.Module] = [nn.Linear(w, w), nn.ReLU()]
        if spec.dropout > 0:
            layers.append(nn.Dropout(spec.dropout))
        return nn.Sequential(*layers)

    def make_batch(batch_size: int, gen: torch.Generator) -> Batch:
        return torch.randn(batch_size, w, generator=gen), torch.randint(0, N_CLASSES, (batch_size,), generator=gen)

    stem = nn.Sequential(nn.Linear(w, w), nn.ReLU()) if spec.stem else nn.Identity()
    blocks = nn.Sequential(*[block() for _ in range(spec.depth)])
    return Built(Chain(stem, blocks, nn.Linear(w, N_CLASSES)), blocks, make_batch, default_loss)


class _ResidualBlock(nn.Module):
    """``x + (Conv3x3 -> BN -> ReLU [-> Dropout] -> Conv3x3 -> BN)(x)`` at constant channels."""

    def __init__(self, c: int, dropout: float):
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU()]
        if dropout > 0:
            layers.append(nn.Dropout(dropout))
        layers += [nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)]
        self.body = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


def build_resnet(spec: ResNetSpec) -> Built:
    """ResNet generator of :class:`ckptlab.spec.models.ResNetSpec` (CycleGAN-style, as in the seed
    documents). Inputs and targets ``(B, 3, image_size, image_size)``; blocks at
    ``(B, 4*channels, image_size/4, image_size/4)``; loss L1."""
    c, s = spec.channels, spec.image_size

    def cbr(cin: int, cout: int, k: int, stride: int = 1, pad: int = 0) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, k, stride, pad, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

    stem = nn.Sequential(*cbr(3, c, 7, pad=3), *cbr(c, 2 * c, 3, 2, 1), *cbr(2 * c, 4 * c, 3, 2, 1))
    blocks = nn.Sequential(*[_ResidualBlock(4 * c, spec.dropout) for _ in range(spec.depth)])
    head = nn.Sequential(
        nn.ConvTranspose2d(4 * c, 2 * c, 3, 2, 1, output_padding=1, bias=False),
        nn.BatchNorm2d(2 * c),
        nn.ReLU(),
        nn.ConvTranspose2d(2 * c, c, 3, 2, 1, output_padding=1, bias=False),
        nn.BatchNorm2d(c),
        nn.ReLU(),
        nn.Conv2d(c, 3, 7, padding=3),
        nn.Tanh(),
    )

    def make_batch(batch_size: int, gen: torch.Generator) -> Batch:
        x = torch.randn(batch_size, 3, s, s, generator=gen)
        return x, torch.rand(batch_size, 3, s, s, generator=gen) * 2 - 1

    return Built(Chain(stem, blocks, head), blocks, make_batch, lambda out, y: F.l1_loss(out.float(), y))


class _DecoderBlock(nn.Module):
    """Pre-norm GPT block: ``x + proj(SDPA(LN(x)))`` then ``x + MLP(LN(x))``; causal."""

    def __init__(self, d: int, heads: int, dropout: float):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d), nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class _Embed(nn.Module):
    def __init__(self, vocab: int, seq_len: int, d: int):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq_len, d)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))


def build_transformer(spec: TransformerSpec) -> Built:
    """GPT-style decoder of :class:`ckptlab.spec.models.TransformerSpec`. Inputs and targets
    ``(B, seq_len)`` token ids (targets: inputs shifted by one); logits ``(B, seq_len,
    vocab_size)``; loss: next-token cross-entropy."""
    d = spec.d_model
    blocks = nn.Sequential(*[_DecoderBlock(d, spec.heads, spec.dropout) for _ in range(spec.depth)])
    head = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, spec.vocab_size, bias=False))

    def make_batch(batch_size: int, gen: torch.Generator) -> Batch:
        tokens = torch.randint(0, spec.vocab_size, (batch_size, spec.seq_len + 1), generator=gen)
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    return Built(Chain(_Embed(spec.vocab_size, spec.seq_len, d), blocks, head), blocks, make_batch, default_loss)


class _DenseLayer(nn.Module):
    """``x -> cat([x, f(x)])`` with ``f`` = BN-ReLU-Conv1x1 (the bottleneck that
    memory-efficient DenseNet recomputes) then BN-ReLU-Conv3x3 to ``growth`` channels."""

    def __init__(self, cin: int, growth: int, bn_size: int, dropout: float):
        super().__init__()
        mid = bn_size * growth
        layers: list[nn.Module] = [
            nn.BatchNorm2d(cin),
            nn.ReLU(),
            nn.Conv2d(cin, mid, 1, bias=False),
            nn.BatchNorm2d(mid),
            nn.ReLU(),
            nn.Conv2d(mid, growth, 3, padding=1, bias=False),
        ]
        if dropout > 0:
            layers.append(nn.Dropout(dropout))
        self.f = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, self.f(x)], dim=1)


def build_densenet(spec: DenseNetSpec) -> Built:
    """One dense block of :class:`ckptlab.spec.models.DenseNetSpec`. Inputs ``(B, 3, image_size,
    image_size)``, targets ``(B,)`` in ``[0, 10)``; layer ``i`` sees ``2k + i*k`` channels."""
    k, s = spec.growth_rate, spec.image_size
    stem = nn.Conv2d(3, 2 * k, 3, padding=1, bias=False)
    blocks = nn.Sequential(*[_DenseLayer(2 * k + i * k, k, spec.bn_size, spec.dropout) for i in range(spec.depth)])
    cout = 2 * k + spec.depth * k
    head = nn.Sequential(
        nn.BatchNorm2d(cout), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cout, N_CLASSES)
    )

    def make_batch(batch_size: int, gen: torch.Generator) -> Batch:
        x = torch.randn(batch_size, 3, s, s, generator=gen)
        return x, torch.randint(0, N_CLASSES, (batch_size,), generator=gen)

    return Built(Chain(stem, blocks, head), blocks, make_batch, default_loss)
