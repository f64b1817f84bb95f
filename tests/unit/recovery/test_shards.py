from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from recovery.shards import (
    DIFF_FILE,
    MARKER,
    BaseShard,
    ShardInputError,
    ShardRebuildError,
    ShardSnapshotter,
)


def base_state(step: int = 50) -> BaseShard:
    gen = torch.Generator().manual_seed(3)
    params = {
        "w": torch.randn(64, 32, generator=gen),
        "h": torch.randn(40, generator=gen).to(torch.bfloat16),
        "frozen": torch.randn(16, generator=gen).to(torch.float16),
        "count": torch.arange(10, dtype=torch.int64),
        "mask": torch.rand(9, generator=gen) > 0.5,
    }
    return BaseShard(step, params, {"state": {0: {"exp_avg": torch.zeros(3)}}, "lr": 1e-4})


def train(base: BaseShard, steps: int) -> tuple[dict[str, torch.Tensor], dict[str, object]]:
    """Some deterministic 'training' from the base: floats drift, ints count, one tensor frozen."""
    params = {k: v.clone() for k, v in base.params.items()}
    for step in range(steps):
        params["w"].add_(torch.sin(params["w"] * (step + 1)) * 1e-3)
        params["h"].add_(torch.tensor(0.0625, dtype=torch.bfloat16))
        params["count"].add_(1)
        params["mask"] = ~params["mask"]
    optimizer = {"state": {0: {"exp_avg": torch.full((3,), float(steps))}}, "lr": 1e-4 * steps}
    return params, optimizer


def fresh_base() -> BaseShard:
    base = base_state()
    return BaseShard(
        base.step, {k: v.clone() for k, v in base.params.items()}, base.optimizer_state
    )


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(
            a.contiguous().reshape(-1).view(torch.uint8),
            b.contiguous().reshape(-1).view(torch.uint8),
        )
    )


def test_rebuilt_shard_equals_the_lost_one_bit_for_bit(tmp_path: Path) -> None:
    snapshots = ShardSnapshotter(tmp_path)
    base = base_state()
    params, optimizer = train(base, 25)
    info = snapshots.snapshot("actor-3", 75, params, optimizer, base)
    assert info.changed_tensors == 4  # "frozen" did not change: not stored
    del params  # the shard is lost

    rebuilt = snapshots.rebuild_shard("actor-3", load_base=lambda shard: fresh_base())
    expected, expected_opt = train(base_state(), 25)
    assert rebuilt.step == 75 and rebuilt.from_snapshot
    assert set(rebuilt.params) == set(expected)
    for name in expected:
        assert bits_equal(rebuilt.params[name], expected[name]), name
    assert torch.equal(
        rebuilt.optimizer_state["state"][0]["exp_avg"], expected_opt["state"][0]["exp_avg"]
    )  # type: ignore[index]
    assert rebuilt.optimizer_state["lr"] == expected_opt["lr"]
    assert snapshots.is_live("actor-3")


def test_maybe_snapshot_follows_the_interval_and_keeps_the_newest(tmp_path: Path) -> None:
    snapshots = ShardSnapshotter(tmp_path, snapshot_interval_steps=25, keep=2)
    base = base_state(step=0)
    written = []
    for step in range(1, 101):
        params, optimizer = train(base, step % 7)
        info = snapshots.maybe_snapshot("s", step, params, optimizer, base)
        if info is not None:
            written.append(info.step)
    assert written == [25, 50, 75, 100]
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == [
        "snap-000000000075",
        "snap-000000000100",
    ]
    latest = snapshots.latest("s")
    assert latest is not None and latest.step == 100


def test_rebuild_counter_feeds_the_five_minute_metric(tmp_path: Path) -> None:
    now = [1000.0]
    snapshots = ShardSnapshotter(tmp_path, clock=lambda: now[0])
    base = base_state()
    params, optimizer = train(base, 1)
    snapshots.snapshot("s", 60, params, optimizer, base)
    for delay in (0, 100, 150):
        now[0] += delay
        snapshots.rebuild_shard("s", load_base=lambda shard: fresh_base())
    assert snapshots.rebuild_count_5m() == 3
    assert snapshots.rebuild_timestamps() == [1000.0, 1100.0, 1250.0]
    now[0] = 1000.0 + 300.0 + 1
    assert snapshots.rebuild_count_5m() == 2
    now[0] = 1250.0 + 301
    assert snapshots.rebuild_count_5m() == 0


def test_corrupt_newest_snapshot_falls_back_to_the_previous_one(tmp_path: Path) -> None:
    snapshots = ShardSnapshotter(tmp_path, keep=3)
    base = base_state()
    for step in (60, 70):
        params, optimizer = train(base, step - 50)
        snapshots.snapshot("s", step, params, optimizer, base)
    diff = tmp_path / "s" / "snap-000000000070" / DIFF_FILE
    raw = bytearray(diff.read_bytes())
    raw[10] ^= 0x01
    diff.write_bytes(bytes(raw))
    assert snapshots.latest("s") is not None and snapshots.latest("s").step == 60  # type: ignore[union-attr]
    rebuilt = snapshots.rebuild_shard("s", load_base=lambda shard: fresh_base())
    assert rebuilt.step == 60
    assert bits_equal(rebuilt.params["w"], train(base_state(), 10)[0]["w"])


def test_snapshot_against_another_checkpoint_is_not_applied(tmp_path: Path) -> None:
    snapshots = ShardSnapshotter(tmp_path)
    base = base_state(step=50)
    params, optimizer = train(base, 5)
    snapshots.snapshot("s", 55, params, optimizer, base)
    newer = BaseShard(100, {k: v.clone() for k, v in params.items()}, {"lr": 9.0})
    rebuilt = snapshots.rebuild_shard("s", load_base=lambda shard: newer)
    assert (
        not rebuilt.from_snapshot and rebuilt.step == 100 and rebuilt.optimizer_state == {"lr": 9.0}
    )


def test_base_that_does_not_fit_the_snapshot_leaves_the_shard_stale(tmp_path: Path) -> None:
    snapshots = ShardSnapshotter(tmp_path)
    base = base_state()
    params, optimizer = train(base, 2)
    snapshots.snapshot("s", 52, params, optimizer, base)
    wrong = fresh_base()
    wrong.params["w"] = torch.zeros(64, 31)  # type: ignore[index]
    with pytest.raises(ShardRebuildError, match="'w'"):
        snapshots.rebuild_shard("s", load_base=lambda shard: wrong)
    assert not snapshots.is_live("s")
    assert snapshots.rebuild_count_5m() == 0


def test_base_with_different_bytes_fails_the_crc_check(tmp_path: Path) -> None:
    snapshots = ShardSnapshotter(tmp_path)
    base = base_state()
    params, optimizer = train(base, 2)
    snapshots.snapshot("s", 52, params, optimizer, base)
    # A base whose bytes differ from the real checkpoint (same layout): the diff applies, but the
    # result is not the lost shard, and the recorded crc32 says so.
    drifted = fresh_base()
    drifted.params["count"].add_(1)  # type: ignore[union-attr]
    with pytest.raises(ShardRebuildError, match="'count' has checksum"):
        snapshots.rebuild_shard("s", load_base=lambda shard: drifted)
    assert not snapshots.is_live("s")


def test_loader_given_to_the_constructor_serves_rebuild_shard_by_id(tmp_path: Path) -> None:
    snapshots = ShardSnapshotter(tmp_path, load_base=lambda shard: fresh_base())
    base = base_state()
    params, optimizer = train(base, 3)
    snapshots.snapshot("s", 53, params, optimizer, base)
    rebuilt = snapshots.rebuild_shard("s")
    assert rebuilt.step == 53 and bits_equal(rebuilt.params["w"], params["w"])
    with pytest.raises(ShardInputError, match="needs load_base"):
        ShardSnapshotter(tmp_path).rebuild_shard("s")


def test_loader_failure_is_a_rebuild_error(tmp_path: Path) -> None:
    snapshots = ShardSnapshotter(tmp_path)

    def broken(shard: str) -> BaseShard:
        raise FileNotFoundError(f"/ckpt/{shard}/latest")

    with pytest.raises(ShardRebuildError, match="/ckpt/s/latest"):
        snapshots.rebuild_shard("s", load_base=broken)
    assert not snapshots.is_live("s")


def test_bad_input_is_named_and_writes_nothing(tmp_path: Path) -> None:
    snapshots = ShardSnapshotter(tmp_path)
    base = base_state()
    params, optimizer = train(base, 1)
    cases = [
        (("../evil", 60, params, optimizer, base), "shard_id"),
        (("s", 40, params, optimizer, base), "older than the base"),
        (("s", -1, params, optimizer, base), "step"),
        (
            ("s", 60, {**params, "extra": torch.zeros(1)}, optimizer, base),
            r"only in params \['extra'\]",
        ),
        (("s", 60, {**params, "w": params["w"].double()}, optimizer, base), "'w'"),
    ]
    for args, match in cases:
        with pytest.raises(ShardInputError, match=match):
            snapshots.snapshot(*args)  # type: ignore[arg-type]
    assert not (tmp_path / "s").exists() or not list((tmp_path / "s").iterdir())
    snapshots.snapshot("s", 60, params, optimizer, base)
    with pytest.raises(ShardInputError, match="already has a snapshot at step 60"):
        snapshots.snapshot("s", 60, params, optimizer, base)
    for kwargs, match in (
        ({"snapshot_interval_steps": 0}, "snapshot_interval_steps"),
        ({"keep": 0}, "keep"),
    ):
        with pytest.raises(ShardInputError, match=match):
            ShardSnapshotter(tmp_path, **kwargs)  # type: ignore[arg-type]


def test_marker_records_what_rebuild_needs(tmp_path: Path) -> None:
    snapshots = ShardSnapshotter(tmp_path)
    base = base_state()
    params, optimizer = train(base, 1)
    info = snapshots.snapshot("s", 51, params, optimizer, base)
    body = json.loads((info.path / MARKER).read_text())["body"]
    meta = body["metadata"]
    assert meta["base_step"] == 50 and meta["step"] == 51
    assert set(meta["checksums"]) == set(params) and meta["checksum"] in ("crc32", "crc32c")
    assert {e["name"] for e in meta["diff_index"]} == {"w", "h", "count", "mask"}


def test_a_prune_cut_short_leaves_no_snapshot_directory_without_its_marker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer killed while deleting an old snapshot: what is left is a temp directory that the
    next snapshot sweeps, never a ``snap-*`` directory whose marker is already gone."""
    snapshots = ShardSnapshotter(tmp_path, snapshot_interval_steps=1, keep=1)
    base = base_state(step=0)
    params, optimizer = train(base, 1)
    snapshots.snapshot("s", 1, params, optimizer, base)

    def killed_mid_delete(path: Path, ignore_errors: bool = False) -> None:
        for marker in list(Path(path).rglob(MARKER)):  # the marker goes, then the process dies
            marker.unlink()
        raise KeyboardInterrupt("killed while pruning")

    monkeypatch.setattr(shutil, "rmtree", killed_mid_delete)
    params, optimizer = train(base, 2)
    with pytest.raises(KeyboardInterrupt):
        snapshots.snapshot("s", 2, params, optimizer, base)
    monkeypatch.undo()
    shard_dir = tmp_path / "s"
    unmarked = [p.name for p in shard_dir.glob("snap-*") if not (p / MARKER).exists()]
    assert unmarked == []
    latest = snapshots.latest("s")
    assert latest is not None and latest.step == 2
    params, optimizer = train(base, 3)
    snapshots.snapshot("s", 3, params, optimizer, base)
    assert sorted(p.name for p in shard_dir.iterdir()) == ["snap-000000000003"]
