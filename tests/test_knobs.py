"""Every flag of ``aiogc run`` / ``ps`` / ``worker`` / ``simulate`` is one row of the field table
(:mod:`aiogc.cli.knobs`): the parsers, the experiment-file keys and the Python keywords are
built from it, and every ``--help`` line states its default."""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

import pytest

from aiogc.cli import command_parser
from aiogc.cli.knobs import COMMANDS, knob_table
from aiogc.cli.run import _key_actions, keyword_name, keyword_values

ROOT = Path(__file__).resolve().parents[1]


def _options(cmd: str) -> list[argparse.Action]:
    return [a for a in command_parser(cmd)._actions
            if a.option_strings and not isinstance(a, argparse._HelpAction)]


@pytest.mark.parametrize("cmd", COMMANDS)
def test_every_flag_is_a_row_of_the_table(cmd: str) -> None:
    rows = {k.flag for k in knob_table() if cmd in k.commands or k.group == "diagnostics"}
    flags = set()
    for act in _options(cmd):
        knob = getattr(act, "knob", None)
        assert knob is not None, f"aiogc {cmd} {act.option_strings}: declared outside the table"
        flags.add(knob.flag)
    assert flags == rows


@pytest.mark.parametrize("cmd", COMMANDS)
def test_every_help_line_shows_its_default(cmd: str) -> None:
    p = command_parser(cmd)
    text = "".join(p.format_help().split())  # wrapping may break a line at a hyphen
    for act in _options(cmd):
        if act.required:
            continue
        line = " ".join((str(act.help) % {"default": act.default}).split())
        assert "(default: " in line, (cmd, act.option_strings, line)
        assert "".join(line.split()) in text


def test_one_row_per_flag_and_per_entries_name_its_commands() -> None:
    flags = Counter(k.flag for k in knob_table())
    assert [f for f, n in flags.items() if n > 1] == []
    for k in knob_table():
        assert set(k.per) <= set(k.commands), k.flag


def test_file_keys_and_keywords_are_the_flags() -> None:
    p = command_parser("run")
    run_flags = {k.flag for k in knob_table() if "run" in k.commands}
    keys = set(_key_actions(p))
    assert keys == run_flags - {"config", "verbose", "quiet"}  # not settings of a run
    for key in keys:  # each is a keyword of aiogc.run, None leaving its default
        assert keyword_values(p, {keyword_name(key): None}, command="aiogc.run") == {}


def test_the_runs_page_flag_list_names_table_flags() -> None:
    readme = (ROOT / "docs" / "guide" / "runs.md").read_text()
    para = readme[readme.index("Common flags (`aiogc run --help`)"):]
    para = para[:para.index("\n\n")]
    named = set(re.findall(r"--([a-z][a-z-]*)", para)) - {"no-verify", "help"}
    run_flags = {k.flag for k in knob_table() if "run" in k.commands}
    assert named and named <= run_flags, named - run_flags
