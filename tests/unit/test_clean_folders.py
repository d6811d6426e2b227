"""The clean removes the folders it left empty on a disk, but not a folder that changed within ``after``, a hidden
folder, a folder that still holds a file, or the source folder itself."""

from __future__ import annotations

import os
import time
from pathlib import Path

from sluice.storage.clean import _remove_empty_folders

HOUR = 3600.0


def folder(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def set_age(path: Path, age: float) -> None:
    stamp = time.time() - age
    os.utime(path, (stamp, stamp))


def test_empty_folders_older_than_after_go_deepest_first(tmp_path: Path) -> None:
    root = tmp_path / "events"
    emptied = folder(root / "2026-08-01")
    holding = folder(root / "2026-08-02")
    (holding / "part-0.json").write_text("{}\n")
    fresh = folder(root / "2026-08-03")
    nested = folder(root / "2026" / "08" / "04")
    hidden = folder(root / "_temporary" / "0")
    dotted = folder(root / ".staging")
    # Times last, children first: making a folder changes its parent's time.
    for path in (emptied, holding, nested, nested.parent, nested.parent.parent, hidden, hidden.parent, dotted, root):
        set_age(path, 2 * HOUR)

    removed = _remove_empty_folders(str(root), time.time() - HOUR)

    assert removed == 4, "2026-08-01, and 2026/08/04, 2026/08 and 2026, each parent found old before its child went"
    assert not emptied.exists() and not (root / "2026").exists()
    assert holding.exists() and (holding / "part-0.json").exists(), "a folder holding a file stays"
    assert fresh.exists(), "changed within after: a producer may be about to write into it"
    assert hidden.exists() and dotted.exists(), "a hidden folder is a producer's own"
    assert root.exists(), "the source folder itself stays, even empty"


def test_an_empty_source_folder_stays(tmp_path: Path) -> None:
    root = folder(tmp_path / "landing")
    set_age(root, 2 * HOUR)
    assert _remove_empty_folders(str(root), time.time() - HOUR) == 0
    assert root.exists()
