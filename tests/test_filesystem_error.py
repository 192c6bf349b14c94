"""A filesystem error in the middle of a run, staged on a real ext4 filesystem: a loop-mounted
image (``errors=remount-ro``) that the kernel is told has failed (``trigger_fs_error``), as a
failing disk or a kernel panic would.  ext4 aborts its journal at once: what reached the disk
(fsync) is kept, what sat in the page cache is gone once the filesystem is checked and mounted
again.

A row the first run reported ``ok`` must find its receipt on the rerun, and the calls paid again
must be among those the first run counted in ``receipts_lost`` (an upper bound: a commit the
failing disk reported as failed may have reached it all the same), and once the disk failed
only the calls already in flight were paid for.  The same staging with
``durability="best-effort"`` (SQLite's ``synchronous=NORMAL``) loses the receipts of rows
already reported ``ok``: it shows the staging drops what was not synced.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

_RUN = """
import asyncio, json, sys
import pandas as pd
import playbook as pb

store, out, durability, trigger = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
calls = []

@pb.tool(name="fetch", version="1")
async def fetch(i: int) -> str:
    calls.append(i)
    if i == 500 and trigger != "-":  # the disk fails under the run
        with open(trigger, "w") as failing:
            failing.write("1")
    await asyncio.sleep(0.001)
    return str(i) * 200

opened = pb.ReceiptStore(store, durability=durability)
refused = opened.lost
if refused:  # the store lost receipts: the rerun is told before it pays; accepted here, to count them
    opened.accept_loss()
run = pd.DataFrame({"i": range(1000)}).play.run(fetch, store=opened, progress=False, concurrency=8)
ok = [int(i) for i, status in zip(run.result["i"], run.result["play_status"]) if status == "ok"]
json.dump({"ok": ok, "calls": calls, "lost": run.stats.receipts_lost, "refused": refused}, open(out, "w"))
"""


def _sh(*command: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{' '.join(command)}: {done.stderr or done.stdout}"


class _Disk:
    """An ext4 image of 64 MB mounted with ``errors=remount-ro`` on a loop device."""

    def __init__(self, tmp: Path) -> None:
        self.image, self.root = tmp / "ext4.img", tmp / "mnt"
        self.root.mkdir()
        with open(self.image, "wb") as image:
            image.truncate(64 << 20)
        _sh("mkfs.ext4", "-q", "-F", str(self.image))
        self.device = ""

    def mount(self) -> None:
        _sh("mount", "-o", "loop,errors=remount-ro", str(self.image), str(self.root))
        found = subprocess.run(
            ["findmnt", "-no", "SOURCE", str(self.root)], capture_output=True, text=True, check=True
        )
        self.device = Path(found.stdout.strip()).name  # loopN

    @property
    def trigger(self) -> str:
        return f"/sys/fs/ext4/{self.device}/trigger_fs_error"

    def checked_again(self) -> None:
        """Unmounted, checked (e2fsck repairs the aborted journal) and mounted again: what a
        machine does when it comes back."""
        _sh("umount", str(self.root))
        subprocess.run(
            ["e2fsck", "-fy", str(self.image)], capture_output=True, timeout=120
        )  # 1: errors corrected
        self.mount()

    def unmount(self) -> None:
        subprocess.run(["umount", str(self.root)], capture_output=True)


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[_Disk]:
    made = _Disk(tmp_path)
    made.mount()
    try:
        yield made
    finally:
        made.unmount()


def _run(tmp_path: Path, store: Path, durability: str, trigger: str, name: str) -> dict:  # type: ignore[type-arg]
    script, out = tmp_path / "run.py", tmp_path / f"{name}.json"
    script.write_text(_RUN)
    done = subprocess.run(
        [sys.executable, str(script), str(store), str(out), durability, trigger],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())  # type: ignore[no-any-return]


def _staged(tmp_path: Path, disk: _Disk, durability: str) -> tuple[dict, dict]:  # type: ignore[type-arg]
    """The first run, the disk failing under it at row 500; the disk checked and mounted again;
    the rerun (a new process).  Returns what each said."""
    store = disk.root / "store"
    first = _run(tmp_path, store, durability, disk.trigger, "first")
    disk.checked_again()
    return first, _run(tmp_path, store, durability, "-", "rerun")


def test_a_filesystem_error_mid_run_loses_no_receipt_of_a_row_reported_ok(
    tmp_path: Path, disk: _Disk
) -> None:
    first, rerun = _staged(tmp_path, disk, "strict")
    assert 400 < len(first["ok"]) < 600 and first["lost"] > 0, first[
        "lost"
    ]  # the disk failed midway, under calls in flight
    paid_again = set(rerun["calls"]) & set(first["calls"])
    assert not paid_again & set(first["ok"]), "rows reported ok lost their receipts"
    assert 0 < len(paid_again) <= first["lost"]  # paid again: no more than what the run said it lost
    assert (
        len(first["calls"]) - len(first["ok"]) <= first["lost"]
    )  # once the disk failed, only calls in flight were paid
    assert rerun["refused"] is None  # the store holds every receipt its mark counted


def test_the_staging_drops_what_was_not_synced(tmp_path: Path, disk: _Disk) -> None:
    """best-effort (synchronous=NORMAL): commits that reached only the page cache are gone, rows
    reported ok among them: what strict durability prevents.  The store's mark (kept in the
    user's state directory, off the failed disk) notices the loss before the rerun pays."""
    first, rerun = _staged(tmp_path, disk, "best-effort")
    assert rerun["refused"] is not None and "now holds" in rerun["refused"], rerun["refused"]
    assert len(set(rerun["calls"]) & set(first["ok"])) > 0
