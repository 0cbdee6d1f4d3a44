"""Text from hosts and inventories on the terminal: the CLI's one escaping, and its one kind of Console.

A host name, a driver link, a package name or an error message that quotes them is data. Printed
raw, an escape sequence in it drives the terminal; through rich, `[...]` is read as markup
(`root@[fe80::1]:22` loses its address, `[/]` raises MarkupError) and `:ab:` becomes an emoji
(`0000:ab:00.0`). Every such text goes through `untrusted` (rich) or `printable` (plain print).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

# Kept as they are: line structure. Everything else that is not printable is shown escaped.
_LAYOUT = frozenset("\n\t")


def printable(text: object) -> str:
    """`text` with control characters (ESC, CR, C1, bidi overrides ...) shown as escapes such as
    '\\x1b', so that what a host sent cannot move the cursor, retitle or recolour the terminal."""
    value = str(text)
    if value.isprintable():
        return value
    return "".join(
        char if char.isprintable() or char in _LAYOUT else char.encode("unicode_escape").decode("ascii")
        for char in value
    )


def untrusted(text: object) -> str:
    """`printable(text)` with rich markup escaped, for a string that rich will parse as markup."""
    from rich.markup import escape

    return escape(printable(text))


def make_console(*, stderr: bool = False, soft_wrap: bool = False, fixed_width: bool = True) -> Console:
    """The CLI's Console: no emoji codes (':ab:' in a PCI address stays text), no highlighting of
    numbers and paths. Reports piped to a file or CI log would wrap at 80 columns: `fixed_width`
    gives them a width tables fit in."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    options: dict[str, Any] = {"emoji": False, "highlight": False, "soft_wrap": soft_wrap, "stderr": stderr}
    if fixed_width and not stream.isatty():
        options["width"] = 160
    return Console(**options)
