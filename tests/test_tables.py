"""Tables for people: the terminal's plain text and the reports' Markdown write cells alike."""

from __future__ import annotations

from svdmlp.tables import format_cell, format_table, markdown_table


def test_plain_table_aligns_first_column_left_and_the_others_right():
    table = format_table(["model", "params", "PPL"], [["dense", 134515008, 43.8136], ["keep 0.8", 1, 85.47]])
    assert table.splitlines() == [
        "model          params    PPL",
        "--------  -----------  -----",
        "dense     134,515,008  43.81",
        "keep 0.8            1  85.47",
    ]


def test_cells():
    assert format_cell(43.81360249487656) == "43.81"
    assert format_cell(123456.7) == "123,457"
    assert format_cell(float("nan")) == "nan"
    assert format_cell(1319) == "1,319"
    assert format_cell("x") == "x"


def test_markdown_table():
    assert markdown_table(["point", "PPL"], [["dense", 43.8136], ["whiten", 1e5]]).splitlines() == [
        "| point | PPL |",
        "|---|---|",
        "| dense | 43.81 |",
        "| whiten | 100,000 |",
    ]
