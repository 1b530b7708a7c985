"""pretrain/common/atomic.py, the one atomic writer: files, JSON, create-once, folders; the umask's permissions; nothing
half-written and no temporary file left by a failure; loadable without importing the pretrain package (the GPU
check does so, without torch)."""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from pretrain.common import atomic

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def umask_027() -> Iterator[None]:
    previous = os.umask(0o027)
    try:
        yield
    finally:
        os.umask(previous)


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_files_are_replaced_whole_with_the_umasks_mode(tmp_path: Path, umask_027: None) -> None:
    atomic.write_text(tmp_path / "a" / "x.txt", "één\n")
    atomic.write_bytes(tmp_path / "a" / "y.bin", b"\x00\x01")
    atomic.write_json(tmp_path / "a" / "z.json", {"b": 1, "a": Path("p")})
    assert (tmp_path / "a" / "x.txt").read_text(encoding="utf-8") == "één\n"
    assert (tmp_path / "a" / "y.bin").read_bytes() == b"\x00\x01"
    assert (tmp_path / "a" / "z.json").read_text() == '{\n  "a": "p",\n  "b": 1\n}'  # layout's format, as before
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["x.txt", "y.bin", "z.json"]
    assert {mode(p) for p in (tmp_path / "a").iterdir()} == {0o640}


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "status.json"
    atomic.write_json(target, {"status": "running"})
    with pytest.raises(TypeError), atomic.writing(target) as tmp:
        tmp.write_text("half")
        raise TypeError("the writer failed")
    with pytest.raises(TypeError):
        atomic.write_json(target, {"x": object()}, default=None)  # not JSON: finetune/manifest's setting
    assert json.loads(target.read_text()) == {"status": "running"}
    assert list(tmp_path.iterdir()) == [target]


def test_writing_hands_a_path_to_any_writer(tmp_path: Path, umask_027: None) -> None:
    with atomic.writing(tmp_path / "out.jsonl") as tmp, tmp.open("w") as f:
        assert not (tmp_path / "out.jsonl").exists()
        f.write('{"text": "a"}\n')
    assert (tmp_path / "out.jsonl").read_text() == '{"text": "a"}\n' and mode(tmp_path / "out.jsonl") == 0o640
    assert list(tmp_path.iterdir()) == [tmp_path / "out.jsonl"]


def test_write_once_keeps_the_first_copy(tmp_path: Path, umask_027: None) -> None:
    path = tmp_path / "done" / "KEY.json"
    assert atomic.write_once(path, "first")
    assert not atomic.write_once(path, b"second")
    assert path.read_text() == "first" and mode(path) == 0o640
    assert list(path.parent.iterdir()) == [path]


def test_write_once_without_hard_links_renames_after_a_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_links(src: object, dst: object) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    path = tmp_path / "run_id"
    assert atomic.write_once(path, "a\n")
    assert not atomic.write_once(path, "b\n")
    assert path.read_text() == "a\n" and list(tmp_path.iterdir()) == [path]


def test_atomic_dir_publishes_a_whole_folder_readable_by_colleagues(tmp_path: Path, umask_027: None) -> None:
    final = tmp_path / "cache" / "tokenizer-abc"
    with atomic.atomic_dir(final) as tmp:
        fd = os.open(tmp / "tokenizer.json", os.O_WRONLY | os.O_CREAT, 0o600)  # as mkstemp, used by libraries
        os.close(fd)
        assert not final.exists()
    assert [p.name for p in final.iterdir()] == ["tokenizer.json"] and mode(final / "tokenizer.json") == 0o640
    assert list(final.parent.iterdir()) == [final]

    with atomic.atomic_dir(final) as tmp:  # another process finished the same folder first: it stays
        (tmp / "other.json").write_text("{}")
    assert [p.name for p in final.iterdir()] == ["tokenizer.json"] and list(final.parent.iterdir()) == [final]

    with pytest.raises(RuntimeError), atomic.atomic_dir(tmp_path / "cache" / "killed") as tmp:
        (tmp / "half").write_text("x")
        raise RuntimeError
    assert list(final.parent.iterdir()) == [final]


def test_publish_dir_replaces_only_when_asked(tmp_path: Path) -> None:
    final, tmp = tmp_path / "step_00000003", tmp_path / ".step_00000003.tmp"
    final.mkdir()
    (final / "old").write_text("")
    tmp.mkdir()
    (tmp / "new").write_text("")
    assert not atomic.publish_dir(tmp, final) and tmp.is_dir()  # kept, and tmp left to the caller
    assert atomic.publish_dir(tmp, final, replace=True)
    assert [p.name for p in final.iterdir()] == ["new"] and list(tmp_path.iterdir()) == [final]
