"""One CLI style (issue 36 item 4): no `<bool>` labels, every option has help, help written as
paragraphs, and "did you mean" for a mistyped catalog name."""

from __future__ import annotations

from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from scalelab.cli import app, main
from scalelab.cli.style import one_paragraph_per_block
from scalelab.suggest import close_names


def _commands() -> list[tuple[str, Any]]:
    """(path, click command) of every verb and sub-verb."""
    found = []

    def walk(prefix: str, command: Any) -> None:
        subs = getattr(command, "commands", None)
        if subs:
            for name, sub in subs.items():
                walk(f"{prefix} {name}".strip(), sub)
        else:
            found.append((prefix, command))

    walk("", typer.main.get_command(app))
    return found


COMMANDS = _commands()


def test_every_verb_is_walked() -> None:
    names = {path for path, _ in COMMANDS}
    assert {"predict", "search", "study", "validate", "hardware", "runs import"} <= names


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=[p for p, _ in COMMANDS])
def test_every_option_has_one_paragraph_of_help(path: str, command: Any) -> None:
    for param in command.params:
        if param.param_type_name != "option":
            continue
        assert param.help, f"{path} {param.opts[0]} has no help"
        assert "\n" not in param.help, f"{path} {param.opts[0]}: a hard line break in its help"
    first = (command.help or "").split("\n\n")[0]
    assert first and "\n" not in first, f"{path}: its summary breaks mid-sentence"


@pytest.mark.parametrize("path", ["", "validate", "predict", "bench", "runs import", "hardware"])
def test_help_shows_no_bool_label(path: str) -> None:
    result = CliRunner().invoke(app, [*path.split(), "--help"], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    assert "<bool>" not in result.output
    assert "--help" in result.output


def test_validate_rows_says_what_it_does() -> None:
    result = CliRunner().invoke(app, ["validate", "--help"], env={"COLUMNS": "200"})
    row = next(line for line in result.output.splitlines() if "--rows" in line)
    assert "every run" in row and "--no-rows" not in row


def test_paragraphs_are_joined_but_lists_kept() -> None:
    text = "Run a thing over\nmany lines.\n\nItems:\n- one\n- two\n\n\bkept\nas is"
    assert one_paragraph_per_block(text) == (
        "Run a thing over many lines.\n\nItems:\n- one\n- two\n\n\bkept\nas is"
    )


@pytest.mark.parametrize(
    ("typed", "names", "expected"),
    [
        ("llama-3-70b", ["llama3-70b", "llama3-8b", "llama2-70b"], ["llama3-70b"]),
        ("Llama3_70B", ["llama3-70b", "llama3-8b"], ["llama3-70b"]),
        ("torchtitna", ["torchtitan", "generic"], ["torchtitan"]),
        ("h100", ["h100-ib", "h200-ib", "a100-ib"], ["h100-ib"]),
        ("gpt4", ["llama3-70b", "torchtitan"], []),
    ],
)
def test_close_names(typed: str, names: list[str], expected: list[str]) -> None:
    assert close_names(typed, names)[: len(expected) or None] == expected


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (
            ["predict", "llama3-70"],
            "model: unknown model 'llama3-70'; did you mean llama3-70b or llama2-70b?",
        ),
        (["predict", "llama2-7b", "-c", "h100"], "did you mean h100-ib?"),
        (["predict", "llama2-7b", "--stack", "torchtitna"], "did you mean torchtitan?"),
    ],
)
def test_a_mistyped_name_gets_one_line_with_a_suggestion(
    args: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1
    assert "llama4-maverick" not in err  # the suggestion, not the whole catalog


@pytest.mark.parametrize(
    ("loader", "typed", "name"),
    [
        ("load_model", "llama3_8b", "llama3-8b"),  # torchtitan's spelling of the flavour
        ("load_model", "Llama-3-8B", "llama3-8b"),
        ("load_cluster", "H100-IB", "h100-ib"),
        ("load_stack", "TorchTitan", "torchtitan"),
        ("load_gpu", "h100_sxm5", "H100-SXM5"),
    ],
)
def test_another_spelling_of_a_catalog_name_is_accepted(loader: str, typed: str, name: str) -> None:
    from scalelab.config import catalog

    assert getattr(catalog, loader)(typed).name == name


def test_a_spelling_shared_by_two_names_is_not_guessed() -> None:
    from scalelab.suggest import same_name

    assert same_name("a-b", ["ab", "a_b"]) is None
    assert same_name("A.B", ["ab", "cd"]) == "ab"
