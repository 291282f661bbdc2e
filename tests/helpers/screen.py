"""A minimal terminal: replays the bytes a program wrote to a pty and returns the final screen.

Understands what rich's progress display and plain output use: printable text, CR, LF,
backspace, cursor up/down/forward/back (ESC[nA/B/C/D), erase line (ESC[nK), erase
display (ESC[nJ); every other escape sequence (colours, cursor visibility) is dropped.
"""

from __future__ import annotations

import re

_CSI = re.compile(r"\x1b\[([0-9;?]*)([@-~])|\x1b[()][0-9A-Za-z]|\x1b[=>78]")


def screen(data: bytes, width: int = 200) -> list[str]:
    text = data.decode("utf-8", "replace")
    lines: list[list[str]] = [[]]
    row = col = 0
    pos = 0
    while pos < len(text):
        m = _CSI.match(text, pos)
        if m:
            pos = m.end()
            arg, final = m.group(1) or "", m.group(2)
            n = int(arg) if arg.isdigit() else None
            if final == "A":
                row = max(0, row - (n or 1))
            elif final == "B":
                row += n or 1
            elif final == "C":
                col += n or 1
            elif final == "D":
                col = max(0, col - (n or 1))
            elif final == "G":
                col = (n or 1) - 1
            elif final == "K":
                while len(lines) <= row:
                    lines.append([])
                line = lines[row]
                if n in (None, 0):
                    del line[col:]
                elif n == 1:
                    line[:col] = [" "] * min(col, len(line))
                else:
                    line.clear()
            elif final == "J":
                if n in (None, 0):
                    del lines[row + 1:]
                    if row < len(lines):
                        del lines[row][col:]
                elif n == 2:
                    lines = [[] for _ in lines]
            continue
        ch = text[pos]
        pos += 1
        if ch == "\r":
            col = 0
        elif ch == "\n":
            row += 1
        elif ch == "\b":
            col = max(0, col - 1)
        elif ch == "\x1b" or ord(ch) < 32:
            continue
        else:
            while len(lines) <= row:
                lines.append([])
            line = lines[row]
            if col >= width:
                row, col = row + 1, 0
                while len(lines) <= row:
                    lines.append([])
                line = lines[row]
            while len(line) < col:
                line.append(" ")
            if col < len(line):
                line[col] = ch
            else:
                line.append(ch)
            col += 1
    return ["".join(line).rstrip() for line in lines]
