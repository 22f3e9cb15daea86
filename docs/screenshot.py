"""Screenshots of the real CLI: run a command on a pseudo-terminal (so it
sees a terminal: colour on, tables at the terminal's width), keep what it
printed, colours included, and draw that as a PNG.

    python docs/screenshot.py docs/bspec-run.png [--columns 110] -- bspec run examples/prompts/edit.txt --base-url URL

Needs Pillow and matplotlib's DejaVu Sans Mono (both come with the ``bench``
extra).  The terminal emulation is small on purpose: SGR colours (16, 256
and true colour, bold), carriage returns and newlines, which is all the
CLI prints.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
from pathlib import Path

import matplotlib
from PIL import Image, ImageDraw, ImageFont

BACKGROUND = (30, 30, 36)
FOREGROUND = (220, 220, 220)
BASIC = [(0, 0, 0), (205, 49, 49), (13, 188, 121), (229, 229, 16), (36, 114, 200), (188, 63, 188), (17, 168, 205), (229, 229, 229)]
BRIGHT = [(102, 102, 102), (241, 76, 76), (35, 209, 139), (245, 245, 67), (59, 142, 234), (214, 112, 214), (41, 184, 219), (255, 255, 255)]
SGR = re.compile(r"\x1b\[([0-9;]*)m|\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


def capture(command: list[str], columns: int, env: dict[str, str]) -> str:
    """What ``command`` prints on a terminal ``columns`` wide (stdout and stderr)."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    process = subprocess.Popen(command, stdout=follower, stderr=follower, stdin=subprocess.DEVNULL, env=env, close_fds=True)
    os.close(follower)
    chunks = []
    while True:
        ready, _, _ = select.select([leader], [], [], 1.0)
        if ready:
            try:
                data = os.read(leader, 65536)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
        elif process.poll() is not None:
            break
    process.wait()
    os.close(leader)
    return b"".join(chunks).decode("utf-8", errors="replace")


def _palette256(n: int) -> tuple[int, int, int]:
    if n < 8:
        return BASIC[n]
    if n < 16:
        return BRIGHT[n - 8]
    if n < 232:
        n -= 16
        steps = [0, 95, 135, 175, 215, 255]
        return steps[n // 36], steps[(n // 6) % 6], steps[n % 6]
    grey = 8 + (n - 232) * 10
    return grey, grey, grey


def cells(text: str, columns: int = 110) -> list[list[tuple[str, tuple[int, int, int], bool]]]:
    """Lines of (character, colour, bold), after colour codes, \\r, \\n and
    wrapping at ``columns``, as a terminal shows them."""
    lines: list[list] = [[]]
    col = 0
    colour, bold = FOREGROUND, False
    pos = 0
    for match in SGR.finditer(text + "\x1b[m"):
        for ch in text[pos : match.start()]:
            if ch == "\n":
                lines.append([])
                col = 0
            elif ch == "\r":
                col = 0
            elif ch >= " " or ch == "\t":
                if col >= columns:
                    lines.append([])
                    col = 0
                line = lines[-1]
                cell = (" " if ch == "\t" else ch, colour, bold)
                if col < len(line):
                    line[col] = cell
                else:
                    line.append(cell)
                col += 1
        pos = match.end()
        if match.group(1) is None:
            continue
        codes = [int(c) if c else 0 for c in match.group(1).split(";")] or [0]
        i = 0
        while i < len(codes):
            c = codes[i]
            if c == 0:
                colour, bold = FOREGROUND, False
            elif c == 1:
                bold = True
            elif c == 22:
                bold = False
            elif c == 39:
                colour = FOREGROUND
            elif 30 <= c <= 37:
                colour = BASIC[c - 30]
            elif 90 <= c <= 97:
                colour = BRIGHT[c - 90]
            elif c == 38 and i + 2 < len(codes) and codes[i + 1] == 5:
                colour = _palette256(codes[i + 2])
                i += 2
            elif c == 38 and i + 4 < len(codes) and codes[i + 1] == 2:
                colour = tuple(codes[i + 2 : i + 5])  # type: ignore[assignment]
                i += 4
            elif c in (48,) and i + 1 < len(codes):
                i += 2 if codes[i + 1] == 5 else 4  # backgrounds are not drawn
            i += 1
    while lines and not lines[-1]:
        lines.pop()
    return lines


def draw(lines: list, path: Path, title: str, size: int = 15) -> None:
    fonts = Path(matplotlib.__file__).parent / "mpl-data" / "fonts" / "ttf"
    regular = ImageFont.truetype(str(fonts / "DejaVuSansMono.ttf"), size)
    heavy = ImageFont.truetype(str(fonts / "DejaVuSansMono-Bold.ttf"), size)
    cell_w = regular.getbbox("M")[2]
    cell_h = int(size * 1.35)
    width = max((len(line) for line in lines), default=40)
    pad, bar = 16, 28
    image = Image.new("RGB", (width * cell_w + 2 * pad, len(lines) * cell_h + 2 * pad + bar), BACKGROUND)
    pen = ImageDraw.Draw(image)
    pen.rectangle([0, 0, image.width, bar], fill=(50, 50, 58))
    for k, dot in enumerate(((255, 95, 86), (255, 189, 46), (39, 201, 63))):
        pen.ellipse([12 + 20 * k, 9, 24 + 20 * k, 21], fill=dot)
    pen.text((80, 6), title, font=regular, fill=(170, 170, 170))
    for row, line in enumerate(lines):
        for col, (ch, colour, bold) in enumerate(line):
            if ch != " ":
                pen.text((pad + col * cell_w, bar + pad + row * cell_h), ch, font=heavy if bold else regular, fill=colour)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("png", type=Path)
    parser.add_argument("--columns", type=int, default=110)
    parser.add_argument("--title", help="shown in the window bar (default: the command)")
    argv = sys.argv[1:]
    if "--" not in argv:
        parser.error("no command given (put it after --)")
    cut = argv.index("--")
    args = parser.parse_args(argv[:cut])
    command = argv[cut + 1 :]
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"} | {"TERM": "xterm-256color", "COLUMNS": str(args.columns)}
    text = capture(command, args.columns, env)
    (args.png.with_suffix(".txt")).write_text(SGR.sub("", text))  # the same output as text, for diffs and search
    lines = cells(text, args.columns)
    draw(lines, args.png, args.title or "$ " + " ".join(command))
    print(f"wrote {args.png} ({len(lines)} lines)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
