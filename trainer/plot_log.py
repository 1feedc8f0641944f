#!/usr/bin/env python3
"""plot_log.py — turn a dfm-train log.jsonl into a PNG loss curve, with no plotting library.

    python3 trainer/plot_log.py OUT/log.jsonl curve.png [--width 800 --height 480]

Draws the training loss (blue), its CE part (green, DFM runs) and the held-out evaluations (red: CE
with predicted memory, or CE when pretraining; orange: fusion off; purple: target memory) against the
step, on a light grid, and writes an 8-bit RGB PNG with zlib (Python standard library only).
"""
import argparse
import json
import math
import struct
import sys
import zlib

COLORS = {"loss": (31, 119, 180), "ce": (44, 160, 44), "eval": (214, 39, 40), "none": (255, 127, 14),
          "target": (148, 103, 189)}


def write_png(path, w, h, px):
    raw = b"".join(b"\x00" + bytes(px[y * w * 3:(y + 1) * w * 3]) for y in range(h))

    def chunk(tag, data):
        c = struct.pack(">I", len(data)) + tag + data
        return c + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
    png += chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")
    with open(path, "wb") as f:
        f.write(png)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("log")
    ap.add_argument("png")
    ap.add_argument("--width", type=int, default=800)
    ap.add_argument("--height", type=int, default=480)
    a = ap.parse_args()
    series = {k: [] for k in COLORS}
    for line in open(a.log):
        r = json.loads(line)
        if "loss" in r:
            series["loss"].append((r["step"], r["loss"]))
            if r.get("mse", 0) > 0:
                series["ce"].append((r["step"], r["ce"]))
        elif "eval" in r:
            e = r["eval"]
            series["eval"].append((r["step"], e.get("ce_pred", e.get("ce"))))
            if "ce_none" in e:
                series["none"].append((r["step"], e["ce_none"]))
            if e.get("ce_target") is not None and not math.isnan(e["ce_target"]):
                series["target"].append((r["step"], e["ce_target"]))
    pts = [p for s in series.values() for p in s]
    if not pts:
        print("no steps in %s" % a.log)
        return 1
    W, H, m = a.width, a.height, 40
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y0, y1 = min(p[1] for p in pts), max(p[1] for p in pts)
    if x1 == x0:
        x1 = x0 + 1
    if y1 == y0:
        y1 = y0 + 1
    px = bytearray([255] * (W * H * 3))

    def put(x, y, c):
        if 0 <= x < W and 0 <= y < H:
            i = (y * W + x) * 3
            px[i:i + 3] = bytes(c)

    def tx(x):
        return int(m + (x - x0) / (x1 - x0) * (W - 2 * m))

    def ty(y):
        return int(H - m - (y - y0) / (y1 - y0) * (H - 2 * m))
    for i in range(11):  # grid
        gx, gy = m + i * (W - 2 * m) // 10, m + i * (H - 2 * m) // 10
        for y in range(m, H - m + 1):
            put(gx, y, (225, 225, 225))
        for x in range(m, W - m + 1):
            put(x, gy, (225, 225, 225))
    for name, s in series.items():
        c = COLORS[name]
        for (xa, ya), (xb, yb) in zip(s, s[1:]):  # Bresenham, 2 px thick
            ax, ay, bx, by = tx(xa), ty(ya), tx(xb), ty(yb)
            n = max(abs(bx - ax), abs(by - ay), 1)
            for k in range(n + 1):
                x, y = ax + (bx - ax) * k // n, ay + (by - ay) * k // n
                put(x, y, c)
                put(x, y + 1, c)
        for x, y in s if len(s) < 50 else []:
            for dx in range(-2, 3):
                for dy in range(-2, 3):
                    put(tx(x) + dx, ty(y) + dy, c)
    write_png(a.png, W, H, px)
    print("%s: steps %g..%g, loss %.4f..%.4f; blue loss, green CE, red eval CE (pred), orange fusion off, "
          "purple target memory" % (a.png, x0, x1, y0, y1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
