"""audit_chart_check.py SVG PNG — check that no label of dfm audit's chart is clipped; exit 1 naming each one.

1. Geometry: every <text> element's extent, estimated with the character-width table of
   dfm_audit_text_width (pipeline/audit/audit_chart.c), lies inside the viewBox.
2. Rendering: rsvg-convert draws the SVG to PNG (on white); a band of 3 pixels along each edge must be
   blank, so no glyph runs into or past the border. The PNG is decoded here (zlib + PNG filters).
"""
import struct
import subprocess
import sys
import xml.etree.ElementTree as ET
import zlib

import numpy as np

NS = "{http://www.w3.org/2000/svg}"


def text_width(s, size, bold):
    """The same table as dfm_audit_text_width."""
    w = 0.0
    for ch in s:
        if "0" <= ch <= "9":
            a = 0.64
        elif "A" <= ch <= "Z":
            a = 0.74
        elif ch in "il.,:;'|!":
            a = 0.32
        elif ch == " ":
            a = 0.33
        elif ch in "mwMW%":
            a = 0.98
        else:
            a = 0.64
        w += a
    return w * size * (1.1 if bold else 1.0) * 1.04


def check_geometry(path):
    root = ET.parse(path).getroot()
    W, H = float(root.get("width")), float(root.get("height"))
    vb = [float(v) for v in root.get("viewBox").split()]
    bad = []
    if vb != [0, 0, W, H]:
        bad.append(f"viewBox {vb} is not 0 0 {W} {H}")
    n = 0
    for t in root.iter(NS + "text"):
        s = "".join(t.itertext())
        size = float(t.get("font-size", root.get("font-size", "12")))
        bold = t.get("font-weight") == "bold"
        x, y = float(t.get("x")), float(t.get("y"))
        w = text_width(s, size, bold)
        anchor = t.get("text-anchor", "start")
        x0 = x - (w if anchor == "end" else w / 2 if anchor == "middle" else 0)
        x1 = x0 + w
        top, bottom = y - 0.8 * size, y + 0.25 * size
        if x0 < 0 or x1 > W or top < 0 or bottom > H:
            bad.append(f"label {s!r} at x {x0:.0f}..{x1:.0f}, y {top:.0f}..{bottom:.0f} leaves the {W:.0f} x {H:.0f} canvas")
        n += 1
    if n < 8:
        bad.append(f"only {n} labels: not the audit chart")
    return W, H, n, bad


def decode_png(data):
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, hdr = 8, b"", None
    while pos < len(data):
        (ln,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + ln]
        if kind == b"IHDR":
            hdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + ln
    w, h, depth, ctype, _, _, interlace = hdr
    assert depth == 8 and ctype in (2, 6) and interlace == 0, f"unexpected PNG format {hdr}"
    bpp = 4 if ctype == 6 else 3
    raw = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(h, 1 + w * bpp)
    out = np.zeros((h, w * bpp), np.int32)
    prev = np.zeros(w * bpp, np.int32)
    for r in range(h):
        f, line = raw[r, 0], raw[r, 1:].astype(np.int32)
        if f == 0:
            cur = line
        elif f == 2:
            cur = (line + prev) & 255
        else:
            cur = line.copy()
            for i in range(w * bpp):
                a = cur[i - bpp] if i >= bpp else 0
                b = prev[i]
                c = prev[i - bpp] if i >= bpp else 0
                if f == 1:
                    p = a
                elif f == 3:
                    p = (a + b) >> 1
                else:
                    pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                    p = a if pa <= pb and pa <= pc else b if pb <= pc else c
                cur[i] = (cur[i] + p) & 255
        out[r] = cur
        prev = cur
    return out.reshape(h, w, bpp)[:, :, :3]


def check_render(svg, png, W, H):
    subprocess.run(["rsvg-convert", "--background-color=white", "-o", png, svg], check=True)
    img = decode_png(open(png, "rb").read())
    h, w = img.shape[:2]
    bad = []
    if (w, h) != (round(W), round(H)):
        bad.append(f"rendered {w} x {h}, the SVG says {W} x {H}")
    if (img < 250).any(axis=2).sum() < 1000:
        bad.append("the rendering is nearly blank")
    for name, band in (("top", img[:3]), ("bottom", img[-3:]), ("left", img[:, :3]), ("right", img[:, -3:])):
        ink = (band < 250).any(axis=-1)
        if ink.any():
            bad.append(f"ink in the {name} border band ({int(ink.sum())} pixels): a label runs off the canvas")
    return bad


def main():
    svg, png = sys.argv[1], sys.argv[2]
    W, H, n, bad = check_geometry(svg)
    bad += check_render(svg, png, W, H)
    for b in bad:
        print("FAIL:", b)
    if bad:
        sys.exit(1)
    print(f"chart ok: {n} labels inside {W:.0f} x {H:.0f}, rendered without ink at the borders")


if __name__ == "__main__":
    main()
