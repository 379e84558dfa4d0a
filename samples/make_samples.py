"""Writes the small sample tensors shipped in samples/ (run from anywhere).

zstack.npy  uint16 (24, 256, 256)  a synthetic fluorescence z-stack (3 MiB)
rgb.npy     uint8  (480, 640, 3)   a synthetic RGB image
series.npy  >f4    (64, 1000)      big-endian float time series, NaN and Inf included
"""
import pathlib

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent


def main() -> None:
    rng = np.random.default_rng(20261130)
    z, y, x = np.mgrid[0:24, 0:256, 0:256].astype(np.float32)
    blobs = np.zeros((24, 256, 256), np.float32)
    for _ in range(40):
        cz, cy, cx = rng.uniform([0, 0, 0], [24, 256, 256])
        r = rng.uniform(4, 14)
        blobs += 3000 * np.exp(-((z - cz) ** 2 * 4 + (y - cy) ** 2 + (x - cx) ** 2) / (2 * r * r))
    zstack = (blobs + rng.poisson(100, blobs.shape)).clip(0, 65535).astype("<u2")
    np.save(HERE / "zstack.npy", zstack)

    yy, xx = np.mgrid[0:480, 0:640]
    rgb = np.stack([(xx * 255 // 639), (yy * 255 // 479), ((xx + yy) % 256)], axis=-1).astype("|u1")
    np.save(HERE / "rgb.npy", rgb)

    t = np.linspace(0, 20, 1000, dtype=np.float64)
    series = np.stack([np.sin(t * (k + 1) / 8) for k in range(64)]).astype(">f4")
    series[3, 10] = np.nan
    series[5, 20] = np.inf
    np.save(HERE / "series.npy", series)


if __name__ == "__main__":
    main()
