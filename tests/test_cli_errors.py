"""Bad input: one line `ncpbench: what: how to fix`, its exit code, no traceback, nothing created.

Every case runs the real `ncpbench.cli.main` in-process (no model is reachable: nothing may get as
far as calling one), then checks that neither the --out path nor anything under it exists.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ncpbench.cli import main
from ncpbench.preflight import EXIT_USAGE

MOCK = ["--narrator", "mock/default", "--auditor", "mock/default", "--player-mode", "scripted"]


def batch(out: str, *extra: str) -> list[str]:
    return ["run", "--envs", "iron-man", "--out", out, *MOCK, *extra]


def single(*extra: str) -> list[str]:
    return ["run", "iron-man", *MOCK, *extra]


CASES: list[tuple[str, list[str], str]] = [
    # numeric ranges: a turn limit of 0 must not become 100, -1 must not play a turn
    ("max-turns-0-single", single("--max-turns", "0"), "--turns 0 is out of range"),
    ("max-turns-0-batch", batch("{out}", "--max-turns", "0"), "--turns 0 is out of range"),
    ("max-turns-negative", single("--max-turns", "-1"), "--turns -1 is out of range"),
    ("replicates-0", batch("{out}", "--replicates", "0"), "--replicates 0 is out of range"),
    ("concurrency-0", batch("{out}", "--concurrency", "0"), "0 would wait forever"),
    ("narrator-concurrency-0", batch("{out}", "--narrator-concurrency", "0"), "--narrator-concurrency 0"),
    ("temperature-5", single("--narrator-temperature", "5"), "--narrator-temperature 5 is out of range"),
    ("top-p-0", single("--auditor-top-p", "0"), "--auditor-top-p 0 is out of range"),
    ("max-tokens-0", single("--narrator-max-tokens", "0"), "--narrator-max-tokens 0"),
    ("timeout-0", single("--narrator-timeout", "0"), "--narrator-timeout 0"),
    ("turn-timeout-0", single("--turn-timeout", "0"), "--turn-timeout 0"),
    ("seed-negative", single("--seed", "-3"), "--seed -3"),
    ("max-total-tokens-0", batch("{out}", "--max-total-tokens", "0"), "--max-total-tokens 0"),
    ("max-cost-negative", batch("{out}", "--max-cost", "-1"), "--max-cost -1"),
    ("max-cost-without-prices", batch("{out}", "--max-cost", "1"), "--max-cost needs prices"),
    ("breaker-negative", batch("{out}", "--circuit-breaker", "-1"), "--circuit-breaker -1"),
    ("shard-out-of-range", batch("{out}", "--shard", "5/2"), "--shard 5/2 is out of range"),
    ("shard-garbage", batch("{out}", "--shard", "x"), "--shard 'x' is not i/n"),
    ("not-a-number", single("--turns", "many"), "invalid int value"),
    ("unknown-flag", single("--narator", "openai/x"), "unrecognized arguments"),
    ("fault-rate-2", ["mock-server", "--fault-rate", "2"], "--fault-rate 2 is out of range"),
    ("fault-kind", ["mock-server", "--fault-kinds", "5000"], "unknown fault kind '5000' (did you mean 500?)"),
    ("audit-eval-cases-0", ["audit-eval", "--auditor", "mock/default", "--cases", "0", "--out", "{out}"],
     "--cases 0 is out of range"),
    ("audit-eval-concurrency-0", ["audit-eval", "--auditor", "mock/default", "--concurrency", "0", "--out", "{out}"],
     "--concurrency 0"),
    # roles: no silent mock, providers, keys
    ("no-roles", ["run", "iron-man"], "no model given for the narrator, player, auditor"),
    ("no-auditor", ["run", "iron-man", "--narrator", "mock/default", "--player-mode", "scripted"],
     "pass --auditor provider/model"),
    ("no-player", ["run", "iron-man", "--narrator", "mock/default", "--auditor", "mock/default"],
     "(or --player-mode scripted)"),
    ("provider-typo", ["run", "iron-man", "--narrator", "opnai/x", "--auditor", "mock/default", "--player-mode",
                       "scripted"], "unknown provider 'opnai' (did you mean openai?)"),
    ("no-provider", ["run", "iron-man", "--narrator", "gpt-4o", "--auditor", "mock/default", "--player-mode",
                     "scripted"], "has no provider"),
    ("missing-key", ["run", "iron-man", "--narrator", "openai/gpt-4o", "--auditor", "mock/default", "--player-mode",
                     "scripted"], "OPENAI_API_KEY is not set"),
    ("named-key-missing", ["run", "iron-man", "--narrator", "openai/m", "--narrator-base-url", "http://127.0.0.1:9/v1",
                           "--narrator-api-key-env", "NO_SUCH_VAR_X", "--auditor", "mock/default",
                           "--player-mode", "scripted"], "NO_SUCH_VAR_X is not set"),
    ("audit-eval-no-auditor", ["audit-eval", "--cases", "9", "--out", "{out}"], "no auditor given"),
    # environments
    ("slug-typo", ["run", "iron-mna", *MOCK], "no environment 'iron-mna' (did you mean iron-man?)"),
    ("envs-typo", ["run", "--envs", "iron-man,zombieland,alein", "--out", "{out}", *MOCK],
     "no environment 'alein' (did you mean alien?)"),
    ("genre-typo", ["run", "--envs", "genre:horor", "--out", "{out}", *MOCK], "(did you mean horror?)"),
    ("envs-twice", ["run", "--envs", "alien,alien", "--out", "{out}", *MOCK], "names 'alien' twice"),
    ("batch-without-out", ["run", "--envs", "all", *MOCK], "needs a SLUG or a batch"),
    ("profile", single("--profile", "paper", "--narrator-top-p", "1.5"), "--narrator-top-p 1.5"),
]


@pytest.mark.parametrize(("argv", "message"), [(a, m) for _, a, m in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_with_exit_2_and_creates_nothing(argv: list[str], message: str, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    out = tmp_path / "out"
    code = main([a.replace("{out}", str(out)) for a in argv])
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.strip()]
    assert code == EXIT_USAGE, err
    assert len(lines) == 1 and lines[0].startswith("ncpbench: ") and "Traceback" not in err, err
    assert message in lines[0]
    assert ": " in lines[0].removeprefix("ncpbench: "), "what is wrong, then how to fix it"
    assert not out.exists()


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(("text", "message"), [
    ("narrator: {model: mock/default\n", "is not valid YAML (line 2)"),
    ("narator: {model: mock/default}\n", "unknown key narator (did you mean narrator?)"),
    ("narrator: {modle: mock/default}\n", "unknown key narrator.modle (did you mean model?)"),
    ("narrator: {model: mock/default, temperature: hot}\n", "narrator.temperature"),
    ("- narrator\n", "is a list, not a mapping"),
    ("player_mode: scriptd\n", "player_mode"),
], ids=["bad-yaml", "unknown-role", "unknown-role-key", "bad-value", "not-a-mapping", "bad-player-mode"])
def test_a_bad_config_file_is_one_line_naming_the_problem(text: str, message: str, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    config = write(tmp_path, "run.yaml", text)
    code = main(["run", "--envs", "iron-man", "--out", str(tmp_path / "out"), "--mock", "--config", str(config)])
    err = capsys.readouterr().err.strip()
    assert code == EXIT_USAGE and len(err.splitlines()) == 1 and message in err, err
    assert not (tmp_path / "out").exists()


def test_a_missing_config_file_names_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "iron-man", "--mock", "--config", str(tmp_path / "nope.yaml")]) == EXIT_USAGE
    assert "does not exist: check the path given to --config" in capsys.readouterr().err


@pytest.mark.parametrize(("var", "value", "message"), [
    ("NCPBENCH_NARRATOR_TEMPERATURE", "abc", "NCPBENCH_NARRATOR_TEMPERATURE='abc': Input should be a valid number"),
    ("NCPBENCH_AUDITOR_MAX_TOKENS", "-5", "NCPBENCH_AUDITOR_MAX_TOKENS='-5'"),
    ("NCPBENCH_PLAYER_CONCURRENCY", "0", "NCPBENCH_PLAYER_CONCURRENCY='0'"),
    ("NCPBENCH_NARRATOR_STRUCTURED", "xml", "NCPBENCH_NARRATOR_STRUCTURED='xml'"),
    ("NCPBENCH_NARRATOR_MODEL", "opnai/x", "unknown provider 'opnai' (did you mean openai?)"),
])
def test_a_bad_environment_variable_is_one_line_naming_it(var: str, value: str, message: str, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(var, value)
    code = main(["run", "iron-man", "--mock", "--out", str(tmp_path / "rec.json")])
    err = capsys.readouterr().err.strip()
    assert code == EXIT_USAGE and len(err.splitlines()) == 1 and message in err, err
    if var != "NCPBENCH_NARRATOR_MODEL":
        assert f"fix or unset {var}" in err
    assert not (tmp_path / "rec.json").exists()


def test_out_under_a_file_or_a_folder_for_one_episode_is_refused_before_any_work(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a_file = write(tmp_path, "file.txt", "x")
    assert main(["run", "--envs", "iron-man", "--out", str(a_file / "run"), *MOCK]) == EXIT_USAGE
    assert "is a file, not a folder" in capsys.readouterr().err
    assert main(["run", "--envs", "iron-man", "--out", str(a_file), *MOCK]) == EXIT_USAGE
    assert "a batch writes a run folder" in capsys.readouterr().err
    folder = tmp_path / "existing"
    folder.mkdir()
    assert main(["run", "iron-man", "--out", str(folder), *MOCK]) == EXIT_USAGE
    assert "names the record file" in capsys.readouterr().err
    assert list(folder.iterdir()) == [] and a_file.read_text() == "x"


def test_an_internal_error_is_one_line_and_the_traceback_needs_debug(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import ncpbench.cli.catalog as catalog

    def broken(args: object) -> int:
        raise RuntimeError("boom with sk-abcdefghijklmnopqrstuvwx inside")

    monkeypatch.setattr(catalog, "cmd_list", broken)  # main registers the commands afresh on each call
    assert main(["list"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "internal error: RuntimeError: boom" in err and "--debug" in err
    assert "sk-abcdefghijklmnopqrstuvwx" not in err, "secrets are redacted from the message"
    with pytest.raises(RuntimeError, match="boom"):
        main(["list", "--debug"])
