"""The DINOv2 and CLIP probes (`bench.features.TIMM_BACKBONES`) compute the official encoders' features: a state dict
in each release's own layout, of seeded random values, saved as the file a trial's `weights` names, is loaded by
bench's loader, and bench's features are compared with a forward pass written here from the official architecture's
math, in float64, on that state dict (plain torch ops: no timm, no code of the reference repositories).

The references read (their code is not copied):
- CLIP: github.com/openai/CLIP clip/model.py (d05afc4): `QuickGELU` x * sigmoid(1.702 x) (lines 166-168);
  `ResidualAttentionBlock` (171-192): pre-LN attention by `nn.MultiheadAttention` (its `in_proj_weight` holds q, k, v
  stacked), pre-LN MLP c_fc -> QuickGELU -> c_proj; `VisionTransformer.forward` (223-240): conv1 patches, the class
  embedding first, `positional_embedding` added, `ln_pre`, the blocks, `ln_post` on the class token, then `proj`,
  which bench leaves out (its features are the class token after `ln_post`). LayerNorm eps 1e-5 (torch's default).
- DINOv2: github.com/facebookresearch/dinov2 (b8931f7) dinov2/models/vision_transformer.py: LayerNorm eps 1e-6 (line
  96), `interpolate_pos_encoding` (180-212: bicubic by scale factor (grid + 0.1) / 37 where the image is not 518
  pixels, no antialiasing: dinov2/hub/backbones.py `_make_dinov2_model`, lines 27-28), `prepare_tokens_with_masks`
  (214-233), the class token after `norm` (`x_norm_clstoken`, 266; `forward`'s head is the identity, 325-330);
  dinov2/layers/block.py `Block.forward` (89-114): x + ls1(attn(norm1 x)), then x + ls2(mlp(norm2 x));
  dinov2/layers/attention.py (69-79): qkv split as (3, heads, head_dim); layer_scale.py: x * gamma; the MLP's
  activation nn.GELU (exact, vision_transformer.py line 62).

Tolerance, from float32 rounding (tests/tolerances.py): bench computes in float32, the reference in float64 on the
same float32 weights and inputs (exact at that scale). Along the path to one feature, each sum of n terms is off by
at most (n - 1) U32 of its terms' magnitudes; a block's longest chain of sums is its qkv projection (width terms),
the attention scores (head_dim), softmax's sum and the weighted values (tokens each), the output projection (width),
the MLP's two layers (width, 4 width) and two LayerNorms' mean and variance (width each): `chain` terms, plus a few
dozen rounded operations (exp, sigmoid or erf, divisions, square roots, residual adds). The residual stream carries
every block's error on (each block adds its own to what it receives; LayerNorm rescales the stream's errors with the
stream, so relative to the magnitudes they add): depth x f32(chain, ops) of the features' magnitude (about 1 after
the final LayerNorm, times its weight), bounded here with the largest |weight| of the final norm, doubled for the
branches' gain on errors that pass through them (their weights are scaled by fan_in^-1/2: gain about 1).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F

from bench import features
from tests.tolerances import f32

timm = pytest.importorskip("timm")

State = dict[str, torch.Tensor]
IMAGES = 2  # a batch of two 224-pixel images: the encoders at full size, in seconds on one core


def draw(shapes: dict[str, tuple[int, ...]], seed: int) -> State:
    """A state dict of `shapes` with seeded values of a trained network's scale: a matrix (or convolution) by its
    fan-in^-1/2 (activations stay about 1 through each layer), norms' weights about 1, biases and the rest small."""
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for key, shape in shapes.items():
        x = torch.randn(shape, generator=gen)
        if key.endswith(("ln_1.weight", "ln_2.weight", "ln_pre.weight", "ln_post.weight", "norm1.weight",
                         "norm2.weight", "norm.weight")):
            x = 1 + 0.2 * x
        elif key.endswith("gamma"):  # DINOv2's LayerScale: well away from its 1e-5 initialisation
            x = 0.5 + 0.2 * x
        elif len(shape) >= 2 and not key.endswith(("embedding", "pos_embed", "cls_token", "mask_token")):
            x = x / math.sqrt(math.prod(shape[1:]))
        else:
            x = 0.1 * x
        state[key] = x
    return state


def clip_vit_b32_official(seed: int) -> State:
    """OpenAI's ViT-B/32 image tower in its released layout (`visual.*`; width 768, 12 blocks, 224 pixels, output 512),
    with two of the text tower's entries, which the loader must pass over."""
    width, grid, layers = 768, 7, 12
    shapes: dict[str, tuple[int, ...]] = {
        "visual.conv1.weight": (width, 3, 32, 32), "visual.class_embedding": (width,),
        "visual.positional_embedding": (grid * grid + 1, width),
        "visual.ln_pre.weight": (width,), "visual.ln_pre.bias": (width,),
        "visual.ln_post.weight": (width,), "visual.ln_post.bias": (width,), "visual.proj": (width, 512),
        "text_projection": (512, 512), "logit_scale": (),
    }
    for i in range(layers):
        p = f"visual.transformer.resblocks.{i}."
        shapes |= {p + "attn.in_proj_weight": (3 * width, width), p + "attn.in_proj_bias": (3 * width,),
                   p + "attn.out_proj.weight": (width, width), p + "attn.out_proj.bias": (width,),
                   p + "ln_1.weight": (width,), p + "ln_1.bias": (width,),
                   p + "mlp.c_fc.weight": (4 * width, width), p + "mlp.c_fc.bias": (4 * width,),
                   p + "mlp.c_proj.weight": (width, 4 * width), p + "mlp.c_proj.bias": (width,),
                   p + "ln_2.weight": (width,), p + "ln_2.bias": (width,)}
    return draw(shapes, seed)


def dinov2_vits14_official(seed: int) -> State:
    """facebookresearch/dinov2's ViT-S/14 in its released layout (`dinov2_vits14_pretrain.pth`: width 384, 6 heads,
    12 blocks, positions for 518 pixels (37 x 37 patches), LayerScale, the masking token)."""
    width, grid, layers = 384, 37, 12
    shapes: dict[str, tuple[int, ...]] = {
        "patch_embed.proj.weight": (width, 3, 14, 14), "patch_embed.proj.bias": (width,),
        "cls_token": (1, 1, width), "pos_embed": (1, grid * grid + 1, width), "mask_token": (1, width),
        "norm.weight": (width,), "norm.bias": (width,),
    }
    for i in range(layers):
        p = f"blocks.{i}."
        shapes |= {p + "norm1.weight": (width,), p + "norm1.bias": (width,),
                   p + "attn.qkv.weight": (3 * width, width), p + "attn.qkv.bias": (3 * width,),
                   p + "attn.proj.weight": (width, width), p + "attn.proj.bias": (width,), p + "ls1.gamma": (width,),
                   p + "norm2.weight": (width,), p + "norm2.bias": (width,),
                   p + "mlp.fc1.weight": (4 * width, width), p + "mlp.fc1.bias": (4 * width,),
                   p + "mlp.fc2.weight": (width, 4 * width), p + "mlp.fc2.bias": (width,), p + "ls2.gamma": (width,)}
    return draw(shapes, seed)


def attention(x: torch.Tensor, qkv_weight: torch.Tensor, qkv_bias: torch.Tensor, out_weight: torch.Tensor,
              out_bias: torch.Tensor, heads: int) -> torch.Tensor:
    """Multi-head self-attention with q, k, v stacked in one projection (CLIP's `in_proj`, DINOv2's `qkv`)."""
    batch, tokens, width = x.shape
    q, k, v = (t.reshape(batch, tokens, heads, width // heads).transpose(1, 2)
               for t in F.linear(x, qkv_weight, qkv_bias).chunk(3, dim=-1))
    weights = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(width // heads), dim=-1)
    return F.linear((weights @ v).transpose(1, 2).reshape(batch, tokens, width), out_weight, out_bias)


def clip_reference(state: State, images: torch.Tensor, heads: int = 12) -> torch.Tensor:
    """CLIP's image features before the projection (`ln_post` of the class token), in float64."""
    s = {k.removeprefix("visual."): v.double() for k, v in state.items() if k.startswith("visual.")}
    width = s["class_embedding"].numel()

    def norm(x: torch.Tensor, name: str) -> torch.Tensor:
        return F.layer_norm(x, (width,), s[f"{name}.weight"], s[f"{name}.bias"], eps=1e-5)

    x = F.conv2d(images.double(), s["conv1.weight"], stride=s["conv1.weight"].shape[-1]).flatten(2).transpose(1, 2)
    x = torch.cat([s["class_embedding"].expand(len(x), 1, width), x], dim=1) + s["positional_embedding"]
    x = norm(x, "ln_pre")
    for i in range(sum(k.endswith("attn.in_proj_weight") for k in s)):
        b = f"transformer.resblocks.{i}."
        x = x + attention(norm(x, b + "ln_1"), s[b + "attn.in_proj_weight"], s[b + "attn.in_proj_bias"],
                          s[b + "attn.out_proj.weight"], s[b + "attn.out_proj.bias"], heads)
        h = F.linear(norm(x, b + "ln_2"), s[b + "mlp.c_fc.weight"], s[b + "mlp.c_fc.bias"])
        x = x + F.linear(h * torch.sigmoid(1.702 * h), s[b + "mlp.c_proj.weight"], s[b + "mlp.c_proj.bias"])
    return norm(x[:, 0], "ln_post")


def dinov2_reference(state: State, images: torch.Tensor, heads: int = 6) -> torch.Tensor:
    """DINOv2's `x_norm_clstoken`, in float64: positions interpolated as the official hub models do."""
    s = {k: v.double() for k, v in state.items()}
    width, patch = s["cls_token"].shape[-1], s["patch_embed.proj.weight"].shape[-1]

    def norm(x: torch.Tensor, name: str) -> torch.Tensor:
        return F.layer_norm(x, (width,), s[f"{name}.weight"], s[f"{name}.bias"], eps=1e-6)

    x = F.conv2d(images.double(), s["patch_embed.proj.weight"], s["patch_embed.proj.bias"], stride=patch)
    rows, cols = x.shape[-2:]
    x = x.flatten(2).transpose(1, 2)
    positions = s["pos_embed"][:, 1:]
    side = math.isqrt(positions.shape[1])
    if (rows, cols) != (side, side):
        grid = positions.reshape(1, side, side, width).permute(0, 3, 1, 2)
        grid = F.interpolate(grid, scale_factor=((rows + 0.1) / side, (cols + 0.1) / side), mode="bicubic",
                             antialias=False)
        positions = grid.permute(0, 2, 3, 1).reshape(1, -1, width)
    x = torch.cat([s["cls_token"].expand(len(x), 1, width), x], dim=1)
    x = x + torch.cat([s["pos_embed"][:, :1], positions], dim=1)
    for i in range(sum(k.endswith("attn.qkv.weight") for k in s)):
        b = f"blocks.{i}."
        x = x + s[b + "ls1.gamma"] * attention(norm(x, b + "norm1"), s[b + "attn.qkv.weight"],
                                               s[b + "attn.qkv.bias"], s[b + "attn.proj.weight"],
                                               s[b + "attn.proj.bias"], heads)
        h = F.gelu(F.linear(norm(x, b + "norm2"), s[b + "mlp.fc1.weight"], s[b + "mlp.fc1.bias"]))
        x = x + s[b + "ls2.gamma"] * F.linear(h, s[b + "mlp.fc2.weight"], s[b + "mlp.fc2.bias"])
    return norm(x[:, 0], "norm")


def rounding_bound(width: int, head_dim: int, tokens: int, depth: int, final_norm: torch.Tensor) -> float:
    """Absolute bound on a float32 feature against its exact value (the module's docstring)."""
    chain = width + head_dim + 2 * tokens + width + width + 4 * width + 2 * width
    return 2 * depth * f32(chain, ops=40) * float(final_norm.abs().max())


def bench_features(backbone: str, state: State, path: Path, images: torch.Tensor) -> torch.Tensor:
    torch.save(state, path)
    with torch.no_grad():
        return features.build_backbone(backbone, str(path))(images).double()


def timms_clip_gelu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same file in timm's GELU build (`vit_base_patch32_clip_224`, bench's CLIP before)."""
    monkeypatch.setitem(features.TIMM_BACKBONES, "clip_vit_b32", ("vit_base_patch32_clip_224", {}))


def timms_dinov2_positions(monkeypatch: pytest.MonkeyPatch) -> None:
    """timm's own interpolation of the positions (antialiased, to the grid: bench's before)."""
    monkeypatch.setattr(features, "official_dinov2_positions", lambda net: None)


@pytest.mark.parametrize(("backbone", "official", "reference", "width", "tokens", "final_norm", "file", "before"), [
    ("clip_vit_b32", lambda: clip_vit_b32_official(seed=11), clip_reference, 768, 50, "visual.ln_post.weight",
     "ViT-B-32.pth", timms_clip_gelu),
    ("dinov2_vits14", lambda: dinov2_vits14_official(seed=12), dinov2_reference, 384, 257, "norm.weight",
     "dinov2_vits14_pretrain.pth", timms_dinov2_positions),
])
def test_the_features_are_the_official_forward(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backbone: str,
                                               official, reference, width: int, tokens: int, final_norm: str,
                                               file: str, before) -> None:  # noqa: ANN001
    """The official file (OpenAI's ViT-B/32 with its QuickGELU; DINOv2's ViT-S/14 at 224 pixels, the positions
    interpolated from 37 x 37 patches to 16 x 16 as DINOv2 does) gives bench the reference's features within float32
    rounding; bench's build before (`before`) misses them by far more than that bound."""
    images = torch.randn(IMAGES, 3, 224, 224, generator=torch.Generator().manual_seed(5))
    state = official()
    want = reference(state, images)
    bound = rounding_bound(width, 64, tokens, 12, state[final_norm])
    got = bench_features(backbone, state, tmp_path / file, images)
    assert got.shape == (IMAGES, width)
    assert (got - want).abs().max() <= bound
    before(monkeypatch)
    assert (bench_features(backbone, state, tmp_path / file, images) - want).abs().max() > bound
