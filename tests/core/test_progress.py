"""Progress bars: a widget in JupyterLab, text in a headless notebook, tqdm's bar in a terminal,
nothing on non-main processes."""

from __future__ import annotations

import pytest

from labkit.core import progress
from labkit.data.shards import ShardConfig, write_raw_shards

WORKER = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
CHIEF = dict(WORKER, RANK="0")


def test_style_follows_where_the_process_runs():
    assert progress.style({}, kernel=False) == "terminal"
    assert progress.style({}, kernel=True) == "text"  # papermill, nbval: no Jupyter server
    assert progress.style({"JPY_SESSION_NAME": "/nb/04.ipynb"}, kernel=True) == "widget"
    assert progress.style(CHIEF, kernel=False) == "terminal"


def test_non_main_processes_and_the_off_switch_stay_quiet():
    assert progress.style(WORKER, kernel=True) == "off"
    assert progress.style({"LABKIT_PROGRESS": "widget"}, is_main=False) == "off"
    assert progress.style({"LABKIT_NO_PROGRESS": "1"}, kernel=True) == "off"
    assert progress.style({"LABKIT_PROGRESS": "text"}, kernel=False) == "text"
    # a forced widget reaches child processes through the environment: they are no kernels
    assert progress.style({"LABKIT_PROGRESS": "widget"}, kernel=False) == "terminal"
    assert progress.style({"LABKIT_PROGRESS": "widget"}, kernel=True) == "widget"


def test_a_bad_override_is_named():
    with pytest.raises(ValueError, match="LABKIT_PROGRESS must be one of widget, text, terminal, off"):
        progress.style({"LABKIT_PROGRESS": "fancy"})


def test_text_bar_goes_to_stdout_and_keeps_its_final_state(monkeypatch, capsys):
    monkeypatch.setenv("LABKIT_PROGRESS", "text")
    assert list(progress.track(range(4), "rungs", unit="rung")) == [0, 1, 2, 3]
    out, err = capsys.readouterr()
    assert err == ""  # a notebook's stderr stays clean
    assert "rungs: 100%" in out and "4/4" in out


def test_off_bar_draws_nothing_but_counts(monkeypatch, capsys):
    monkeypatch.setenv("LABKIT_NO_PROGRESS", "1")
    with progress.progress(3, "quiet") as bar:
        bar.update(3)
    assert capsys.readouterr() == ("", "")


def test_shard_writing_shows_a_bar(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("LABKIT_PROGRESS", "text")
    shards = write_raw_shards(tmp_path, (bytes([i]) * 8 for i in range(10)), 10, ShardConfig(records_per_shard=4))
    assert shards.counts == [4, 4, 2]
    out = capsys.readouterr().out
    assert "write raw shards: 100%" in out and "10/10" in out
