"""A tiny line-chart rasteriser and PNG writer (zlib + struct only).

Used when matplotlib is not installed (CI installs only the test extras), so
the harness still produces its chart: axes, a log-scaled y axis with decade
ticks, one coloured polyline with square markers per series, a legend, and
labels in a built-in 5x7 bitmap font (upper case).
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path

_GLYPHS = {
    "0": ["01110", "10001", "10011", "10101", "11001", "10001", "01110"],
    "1": ["00100", "01100", "00100", "00100", "00100", "00100", "01110"],
    "2": ["01110", "10001", "00001", "00010", "00100", "01000", "11111"],
    "3": ["11111", "00010", "00100", "00010", "00001", "10001", "01110"],
    "4": ["00010", "00110", "01010", "10010", "11111", "00010", "00010"],
    "5": ["11111", "10000", "11110", "00001", "00001", "10001", "01110"],
    "6": ["00110", "01000", "10000", "11110", "10001", "10001", "01110"],
    "7": ["11111", "00001", "00010", "00100", "01000", "01000", "01000"],
    "8": ["01110", "10001", "10001", "01110", "10001", "10001", "01110"],
    "9": ["01110", "10001", "10001", "01111", "00001", "00010", "01100"],
    "A": ["01110", "10001", "10001", "11111", "10001", "10001", "10001"],
    "B": ["11110", "10001", "10001", "11110", "10001", "10001", "11110"],
    "C": ["01110", "10001", "10000", "10000", "10000", "10001", "01110"],
    "D": ["11100", "10010", "10001", "10001", "10001", "10010", "11100"],
    "E": ["11111", "10000", "10000", "11110", "10000", "10000", "11111"],
    "F": ["11111", "10000", "10000", "11110", "10000", "10000", "10000"],
    "G": ["01110", "10001", "10000", "10111", "10001", "10001", "01111"],
    "H": ["10001", "10001", "10001", "11111", "10001", "10001", "10001"],
    "I": ["01110", "00100", "00100", "00100", "00100", "00100", "01110"],
    "J": ["00111", "00010", "00010", "00010", "00010", "10010", "01100"],
    "K": ["10001", "10010", "10100", "11000", "10100", "10010", "10001"],
    "L": ["10000", "10000", "10000", "10000", "10000", "10000", "11111"],
    "M": ["10001", "11011", "10101", "10101", "10001", "10001", "10001"],
    "N": ["10001", "10001", "11001", "10101", "10011", "10001", "10001"],
    "O": ["01110", "10001", "10001", "10001", "10001", "10001", "01110"],
    "P": ["11110", "10001", "10001", "11110", "10000", "10000", "10000"],
    "Q": ["01110", "10001", "10001", "10001", "10101", "10010", "01101"],
    "R": ["11110", "10001", "10001", "11110", "10100", "10010", "10001"],
    "S": ["01111", "10000", "10000", "01110", "00001", "00001", "11110"],
    "T": ["11111", "00100", "00100", "00100", "00100", "00100", "00100"],
    "U": ["10001", "10001", "10001", "10001", "10001", "10001", "01110"],
    "V": ["10001", "10001", "10001", "10001", "10001", "01010", "00100"],
    "W": ["10001", "10001", "10001", "10101", "10101", "10101", "01010"],
    "X": ["10001", "10001", "01010", "00100", "01010", "10001", "10001"],
    "Y": ["10001", "10001", "10001", "01010", "00100", "00100", "00100"],
    "Z": ["11111", "00001", "00010", "00100", "01000", "10000", "11111"],
    " ": ["00000"] * 7,
    ".": ["00000", "00000", "00000", "00000", "00000", "01100", "01100"],
    ",": ["00000", "00000", "00000", "00000", "01100", "00100", "01000"],
    "-": ["00000", "00000", "00000", "11111", "00000", "00000", "00000"],
    "+": ["00000", "00100", "00100", "11111", "00100", "00100", "00000"],
    "=": ["00000", "00000", "11111", "00000", "11111", "00000", "00000"],
    "/": ["00000", "00001", "00010", "00100", "01000", "10000", "00000"],
    "(": ["00010", "00100", "01000", "01000", "01000", "00100", "00010"],
    ")": ["01000", "00100", "00010", "00010", "00010", "00100", "01000"],
    ":": ["00000", "01100", "01100", "00000", "01100", "01100", "00000"],
    "%": ["11000", "11001", "00010", "00100", "01000", "10011", "00011"],
    "_": ["00000", "00000", "00000", "00000", "00000", "00000", "11111"],
    "'": ["01100", "00100", "01000", "00000", "00000", "00000", "00000"],
    "?": ["01110", "10001", "00001", "00010", "00100", "00000", "00100"],
}
_ALIASES = {"×": "X", "–": "-", "—": "-", "µ": "U"}

PALETTE = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189),
           (140, 86, 75), (227, 119, 194)]
BLACK = (0, 0, 0)
GREY = (200, 200, 200)
WHITE = (255, 255, 255)


class Canvas:
    def __init__(self, width: int, height: int) -> None:
        self.width = width
        self.height = height
        self.pixels = bytearray(WHITE * (width * height))

    def set(self, x: int, y: int, color: tuple[int, int, int]) -> None:
        if 0 <= x < self.width and 0 <= y < self.height:
            offset = 3 * (y * self.width + x)
            self.pixels[offset:offset + 3] = bytes(color)

    def rect(self, x0: int, y0: int, x1: int, y1: int, color: tuple[int, int, int]) -> None:
        for y in range(max(min(y0, y1), 0), min(max(y0, y1), self.height - 1) + 1):
            for x in range(max(min(x0, x1), 0), min(max(x0, x1), self.width - 1) + 1):
                self.set(x, y, color)

    def line(self, x0: int, y0: int, x1: int, y1: int, color: tuple[int, int, int], width: int = 1) -> None:
        dx, dy = abs(x1 - x0), -abs(y1 - y0)
        sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
        err = dx + dy
        half = width // 2
        while True:
            self.rect(x0 - half, y0 - half, x0 - half + width - 1, y0 - half + width - 1, color)
            if x0 == x1 and y0 == y1:
                return
            e2 = 2 * err
            if e2 >= dy:
                err += dy
                x0 += sx
            if e2 <= dx:
                err += dx
                y0 += sy

    def text(self, x: int, y: int, text: str, color: tuple[int, int, int] = BLACK, scale: int = 1) -> None:
        for char in text.upper():
            glyph = _GLYPHS.get(_ALIASES.get(char, char), _GLYPHS["?"])
            for row, bits in enumerate(glyph):
                for col, bit in enumerate(bits):
                    if bit == "1":
                        self.rect(x + col * scale, y + row * scale,
                                  x + col * scale + scale - 1, y + row * scale + scale - 1, color)
            x += 6 * scale

    def vtext(self, x: int, y: int, text: str, color: tuple[int, int, int] = BLACK) -> None:
        """Text rotated 90° counter-clockwise, starting at the bottom (x, y)."""
        for char in text.upper():
            glyph = _GLYPHS.get(_ALIASES.get(char, char), _GLYPHS["?"])
            for row, bits in enumerate(glyph):
                for col, bit in enumerate(bits):
                    if bit == "1":
                        self.set(x + row, y - col, color)
            y -= 6

    def png(self) -> bytes:
        raw = bytearray()
        stride = 3 * self.width
        for y in range(self.height):
            raw.append(0)
            raw += self.pixels[y * stride:(y + 1) * stride]

        def chunk(kind: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(bytes(raw), 9)) \
            + chunk(b"IEND", b"")


def text_width(text: str, scale: int = 1) -> int:
    return 6 * scale * len(text)


def _short(value: float) -> str:
    if value >= 1000:
        return f"{value / 1000:g}K"
    return f"{value:g}"


def line_chart(path: Path, title: str, xlabel: str, ylabel: str,
               series: Sequence[tuple[str, Sequence[tuple[float, float]]]],
               width: int = 880, height: int = 550,
               ranges: Sequence[dict[float, tuple[float, float]]] = ()) -> None:
    """Draw ``series`` (label, [(x, y)]) with optional min–max bars per point."""
    canvas = Canvas(width, height)
    left, right, top, bottom = 80, width - 250, 50, height - 60
    points = [(x, y) for _, pts in series for x, y in pts if y > 0]
    xs = sorted({x for x, _ in points}) or [1.0]
    ys = [y for _, y in points] + [v for r in ranges for lo_hi in r.values() for v in lo_hi if v > 0]
    ys = ys or [1.0]
    ylo = 10 ** math.floor(math.log10(min(ys)))
    yhi = 10 ** math.ceil(math.log10(max(ys)))
    if yhi <= ylo:
        yhi = ylo * 10
    xlo, xhi = min(xs), max(xs)
    if xhi == xlo:
        xlo, xhi = xlo - 1, xhi + 1
    pad = (xhi - xlo) * 0.08
    xlo, xhi = xlo - pad, xhi + pad

    def px(x: float) -> int:
        return int(left + (x - xlo) / (xhi - xlo) * (right - left))

    def py(y: float) -> int:
        frac = (math.log10(y) - math.log10(ylo)) / (math.log10(yhi) - math.log10(ylo))
        return int(bottom - frac * (bottom - top))

    # grid and ticks
    decade = ylo
    while decade <= yhi * 1.0001:
        for mult in (1, 2, 5):
            value = decade * mult
            if ylo <= value <= yhi:
                y = py(value)
                canvas.line(left, y, right, y, GREY)
                label = _short(value)
                canvas.text(left - 8 - text_width(label), y - 3, label)
        decade *= 10
    for x in xs:
        canvas.line(px(x), top, px(x), bottom, GREY)
        label = f"{x:g}"
        canvas.text(px(x) - text_width(label) // 2, bottom + 8, label)
    canvas.line(left, bottom, right, bottom, BLACK, 2)
    canvas.line(left, top, left, bottom, BLACK, 2)
    canvas.text(left, 15, title, scale=2)
    canvas.text((left + right) // 2 - text_width(xlabel) // 2, bottom + 30, xlabel)
    canvas.vtext(15, (top + bottom) // 2 + text_width(ylabel) // 2, ylabel)
    # series and legend
    for index, (label, pts) in enumerate(series):
        color = PALETTE[index % len(PALETTE)]
        coords = [(px(x), py(y)) for x, y in sorted(pts) if y > 0]
        for (x0, y0), (x1, y1) in zip(coords, coords[1:]):
            canvas.line(x0, y0, x1, y1, color, 2)
        bars = ranges[index] if index < len(ranges) else {}
        for x, (lo, hi) in bars.items():
            if lo > 0 and hi > 0:
                canvas.line(px(x), py(lo), px(x), py(hi), color)
                canvas.line(px(x) - 4, py(lo), px(x) + 4, py(lo), color)
                canvas.line(px(x) - 4, py(hi), px(x) + 4, py(hi), color)
        for x, y in coords:
            canvas.rect(x - 3, y - 3, x + 3, y + 3, color)
        ly = top + 10 + index * 18
        canvas.rect(right + 15, ly, right + 27, ly + 6, color)
        canvas.text(right + 33, ly, label[:34])
    path.write_bytes(canvas.png())
