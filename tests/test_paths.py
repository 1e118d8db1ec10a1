"""The one way a command writes a file the user named: through links, never over what is not a regular
file, atomically, keeping the file's mode."""

from __future__ import annotations

import os
import stat

import pytest

from svdmlp.paths import write_output


def test_a_new_file_is_written_and_its_folders_made(tmp_path):
    path = write_output(tmp_path / "a" / "b.json", "{}\n")
    assert path.read_text() == "{}\n"
    assert [p.name for p in path.parent.iterdir()] == ["b.json"]  # no staging file left


def test_a_link_is_written_through(tmp_path):
    real = tmp_path / "real.json"
    real.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    write_output(link, "new")
    assert link.is_symlink() and real.read_text() == "new"


def test_a_directory_is_refused(tmp_path):
    with pytest.raises(ValueError, match="is a directory; name a file"):
        write_output(tmp_path, "x")


def test_a_fifo_is_refused_and_left(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="not a regular file"):
        write_output(fifo, "x")
    assert stat.S_ISFIFO(fifo.stat().st_mode)


def test_a_device_is_refused():
    with pytest.raises(ValueError, match="not a regular file"):
        write_output("/dev/null", "x")


def test_an_existing_file_keeps_its_mode(tmp_path):
    path = tmp_path / "out.json"
    path.write_text("old")
    path.chmod(0o640)
    write_output(path, "new")
    assert stat.S_IMODE(path.stat().st_mode) == 0o640 and path.read_text() == "new"
