"""Tables for people: plain text for the terminal, Markdown for reports; one way to write a cell."""

from __future__ import annotations


def format_table(headers: list[str], rows: list[list[object]]) -> str:
    """Left-aligned first column, right-aligned others, widths fitted to the content."""
    cells = [[str(h) for h in headers]] + [[format_cell(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]

    def line(row: list[str]) -> str:
        parts = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)]
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), rule, *(line(r) for r in cells[1:])])


def markdown_table(headers: list[str], rows: list[list[object]]) -> str:
    """A GitHub-flavoured Markdown table, cells written as in :func:`format_table`."""
    lines = ["| " + " | ".join(str(h) for h in headers) + " |", "|---" * len(headers) + "|"]
    return "\n".join(lines + ["| " + " | ".join(format_cell(v) for v in row) + " |" for row in rows])


def format_cell(value: object) -> str:
    """Floats to four significant digits (whole numbers from 10⁴ up), ints with thousands separators."""
    if isinstance(value, float):
        if value != value:  # NaN
            return "nan"
        return f"{value:,.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)
