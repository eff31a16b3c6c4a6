"""Pictures drawn with Pillow alone: scatter plots, image grids, strips of pictures over training.

Charts (axes, legends) are matplotlib's, in `ampgan.reporting.sweep_report` (its heat map included).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

REAL = (40, 40, 40)
FAKE = (240, 140, 60)


def scatter(real: np.ndarray, fake: np.ndarray, path: Path, size: int = 480, title: str = "") -> Path:
    """Generated points in orange, real points drawn over them in dark grey, on a shared square extent."""
    both = np.concatenate([real, fake[np.isfinite(fake).all(axis=1)]])
    lo, hi = np.percentile(both, 0.5, axis=0).min(), np.percentile(both, 99.5, axis=0).max()
    lo, hi = min(lo, real.min()) - 0.1, max(hi, real.max()) + 0.1
    img = Image.new("RGB", (size, size), "white")
    draw = ImageDraw.Draw(img)

    def to_px(p: np.ndarray) -> np.ndarray:
        return (p - lo) / (hi - lo) * (size - 20) + 10

    for pts, colour, r in ((fake, FAKE, 1.5), (real, REAL, 0.8)):
        for x, y in to_px(pts[np.isfinite(pts).all(axis=1)]):
            draw.ellipse((x - r, size - y - r, x + r, size - y + r), fill=colour)
    draw.text((8, 6), title or "dark: real, orange: generated", fill=(0, 0, 0))
    img.save(path)
    return Path(path)


def image_grid(images: np.ndarray, path: Path, ncol: int = 8, zoom: int = 4) -> Path:
    """(N, 1, H, W) images in [-1, 1] tiled in a grid, scaled up `zoom` times."""
    n, _, h, w = images.shape
    nrow = -(-n // ncol)
    grid = np.full((nrow * (h + 1) + 1, ncol * (w + 1) + 1), 0.5, dtype=np.float32)
    for i, im in enumerate(np.clip((np.nan_to_num(images[:, 0]) + 1) / 2, 0, 1)):
        r, c = divmod(i, ncol)
        grid[1 + r * (h + 1) : 1 + r * (h + 1) + h, 1 + c * (w + 1) : 1 + c * (w + 1) + w] = im
    img = Image.fromarray((grid * 255).astype(np.uint8)).resize((grid.shape[1] * zoom, grid.shape[0] * zoom), Image.NEAREST)
    img.save(path)
    return Path(path)


def strip(frames: list[Path], path: Path, height: int = 200, most: int = 8) -> Path:
    """Pictures side by side, each scaled to `height` and labelled with its file name's step (`step-000250.png`).

    More than `most` frames: evenly spaced ones, the first and the last included.
    """
    frames = list(frames)
    if len(frames) > most:
        frames = [frames[int(round(i))] for i in np.linspace(0, len(frames) - 1, most)]
    top = 16
    tiles = []
    for f in frames:
        with Image.open(f) as im:
            im = im.convert("RGB")
            tiles.append(im.resize((max(1, round(im.width * height / im.height)), height), Image.LANCZOS))
    img = Image.new("RGB", (sum(t.width for t in tiles) + 2 * (len(tiles) + 1), height + top + 2), "white")
    draw = ImageDraw.Draw(img)
    x = 2
    for f, t in zip(frames, tiles):
        img.paste(t, (x, top))
        stem = Path(f).stem
        label = f"step {int(stem[5:])}" if stem.startswith("step-") and stem[5:].isdigit() else stem
        draw.text((x + 3, 2), label, fill=(0, 0, 0))
        x += t.width + 2
    img.save(path)
    return Path(path)
