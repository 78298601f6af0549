"""Adaptive chunks (TASK_CHUNKING with ``targetRuntimeSeconds``): the size rule of the reference
CLI, and an ``AdaptiveChunker`` that hands every frame out exactly once, skips frames already
done, keeps to the range and the range constraint, and takes chunks from several threads."""

from __future__ import annotations

import math
import random
import threading
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openjd.model import IntRangeExpr, StepParameterSpaceIterator

from core import prepare_job
from core.job._planning import AdaptiveChunker, adaptive_chunk_size, group_key, is_adaptive
from core.job._template import parse_template


def chunked_space(
    frames: str | list[int] = "1-100",
    *,
    default: int = 5,
    target: int | None = 60,
    contiguous: bool = True,
    cameras: list[str] | None = None,
) -> Any:
    """The parameterSpace of a one-step job with a CHUNK[INT] ``Frame`` (and ``Camera``)."""
    chunks: dict[str, Any] = {
        "defaultTaskCount": default,
        "rangeConstraint": "CONTIGUOUS" if contiguous else "NONCONTIGUOUS",
    }
    if target is not None:
        chunks["targetRuntimeSeconds"] = target
    params: list[dict[str, Any]] = []
    if cameras is not None:
        params.append({"name": "Camera", "type": "STRING", "range": cameras})
    params.append({"name": "Frame", "type": "CHUNK[INT]", "range": frames, "chunks": chunks})
    job = prepare_job(
        parse_template(
            {
                "specificationVersion": "jobtemplate-2023-09",
                "extensions": ["TASK_CHUNKING"],
                "name": "chunks",
                "steps": [
                    {
                        "name": "Render",
                        "parameterSpace": {"taskParameterDefinitions": params},
                        "script": {"actions": {"onRun": {"command": "true"}}},
                    }
                ],
            }
        )
    )
    return job.step("Render").parameterSpace


def frames_of(chunk: dict[str, Any]) -> list[int]:
    return list(IntRangeExpr.from_str(str(chunk["Frame"].value)))


def drain(chunker: AdaptiveChunker) -> list[dict[str, Any]]:
    out = []
    while (chunk := chunker.next_chunk()) is not None:
        out.append(chunk)
    return out


def plain(chunk: dict[str, Any]) -> dict[str, str]:
    return {k: str(v.value) for k, v in chunk.items()}


# --- the rule ---------------------------------------------------------------------------------


def test_rule_matches_the_reference_cli() -> None:
    # The cases of openjd-cli's test_adaptive_chunk_size.py.
    assert adaptive_chunk_size(4, 1, 1.0, 60) == 18  # blended: 0.75 * 4 + 0.25 * 60
    assert adaptive_chunk_size(4, 10, 10.0, 60) == 60  # 10 frames measured: no more blending
    assert adaptive_chunk_size(50, 1, 30.0, 60) == 2  # a shrink is not blended
    assert adaptive_chunk_size(1, 1, 1000.0, 1) == 1  # never below 1
    for seconds in (0.0, -0.0, -1.0, math.inf, math.nan):
        assert adaptive_chunk_size(1, 1, seconds, 60) is None
    for frames in (0, -1):
        assert adaptive_chunk_size(1, frames, 5.0, 60) is None


def test_rule_waits_for_a_time_it_can_divide_by() -> None:
    assert adaptive_chunk_size(5, 100, 5e-324, 60) is None  # 5e-324 / 100 underflows to 0
    assert adaptive_chunk_size(5, 1, 1e-300, 1e10) is None  # the ideal overflows


# --- sizes ------------------------------------------------------------------------------------


def test_sizes_grow_when_frames_are_fast() -> None:
    chunker = AdaptiveChunker(chunked_space("1-10000", default=2, target=10))
    sizes = []
    for _ in range(6):
        chunk = chunker.next_chunk()
        assert chunk is not None
        sizes.append(len(frames_of(chunk)))
        chunker.report(len(frames_of(chunk)), 0.1 * len(frames_of(chunk)))  # 0.1 s a frame
    assert sizes[0] == 2
    assert sizes == sorted(sizes) and sizes[-1] > sizes[0]
    assert chunker.chunk_size == 100  # 10 s / 0.1 s, once 10 frames were measured


def test_sizes_shrink_when_frames_are_slow() -> None:
    chunker = AdaptiveChunker(chunked_space("1-1000", default=20, target=60))
    chunk = chunker.next_chunk()
    assert chunk is not None and len(frames_of(chunk)) == 20
    assert chunker.report(20, 20 * 15.0) == 4  # 15 s a frame: 60 / 15
    chunk = chunker.next_chunk()
    assert chunk is not None and frames_of(chunk) == [21, 22, 23, 24]


def test_measurements_add_up_over_every_report() -> None:
    chunker = AdaptiveChunker(chunked_space(default=10, target=60))
    chunker.report(10, 10.0)
    chunker.report(10, 50.0)  # 20 frames in 60 s: 3 s a frame
    assert chunker.measured == (20, 60.0)
    assert chunker.chunk_size == 20


def test_a_report_of_no_frames_or_no_time_keeps_the_size() -> None:
    chunker = AdaptiveChunker(chunked_space(default=7, target=60))
    assert chunker.report(0, 12.0) == 7
    assert chunker.report(3, 0.0) == 7
    assert chunker.measured == (3, 0.0)


def test_max_chunk_size_caps_the_growth_and_the_default() -> None:
    chunker = AdaptiveChunker(chunked_space(default=50, target=60), max_chunk_size=8)
    assert chunker.chunk_size == 8
    chunker.report(100, 1.0)
    assert chunker.chunk_size == 8
    assert all(len(frames_of(c)) <= 8 for c in drain(chunker))


def test_bad_reports_and_arguments_are_refused() -> None:
    chunker = AdaptiveChunker(chunked_space())
    with pytest.raises(ValueError):
        chunker.report(-1, 1.0)
    for seconds in (-1.0, math.nan, math.inf):
        with pytest.raises(ValueError):
            chunker.report(1, seconds)
    with pytest.raises(ValueError):
        AdaptiveChunker(chunked_space(), max_chunk_size=0)


@pytest.mark.parametrize("target", [None, 0])
def test_a_step_without_a_target_runtime_is_not_adaptive(target: int | None) -> None:
    space = chunked_space(target=target)
    assert not is_adaptive(space)
    with pytest.raises(ValueError, match="targetRuntimeSeconds"):
        AdaptiveChunker(space)


def test_a_step_without_chunks_is_refused() -> None:
    assert not is_adaptive(None)
    with pytest.raises(ValueError):
        AdaptiveChunker(None)


# --- frames -----------------------------------------------------------------------------------


def test_chunks_are_the_iterators_chunks_until_the_size_changes() -> None:
    space = chunked_space("1-10,15,20-30:2", default=4, contiguous=False, cameras=["L", "R"])
    expected = [plain(p) for p in StepParameterSpaceIterator(space=space)]
    assert [plain(c) for c in drain(AdaptiveChunker(space))] == expected
    space = chunked_space("1-10,15,20-30:2", default=4, cameras=["L", "R"])
    expected = [plain(p) for p in StepParameterSpaceIterator(space=space)]
    assert [plain(c) for c in drain(AdaptiveChunker(space))] == expected


def test_contiguous_chunks_stop_at_gaps_in_the_range() -> None:
    chunker = AdaptiveChunker(chunked_space("1-3,5-12,20", default=100))
    assert [c["Frame"].value for c in drain(chunker)] == ["1-3", "5-12", "20-20"]


def test_frames_done_are_skipped_per_combination() -> None:
    space = chunked_space("1-10", default=4, cameras=["L", "R"])
    left = group_key({"Camera": "L", "Frame": "1-10"}, "Frame")
    chunker = AdaptiveChunker(space, done={left: {2, 3, 9}})
    got = [(c["Camera"].value, c["Frame"].value) for c in drain(chunker)]
    assert got == [
        ("L", "1-1"),
        ("L", "4-7"),
        ("L", "8-8"),
        ("L", "10-10"),
        ("R", "1-4"),
        ("R", "5-8"),
        ("R", "9-10"),
    ]


def test_noncontiguous_chunks_close_over_done_frames() -> None:
    chunker = AdaptiveChunker(
        chunked_space("1-10", default=4, contiguous=False), done={"{}": {2, 3}}
    )
    assert [frames_of(c) for c in drain(chunker)] == [[1, 4, 5, 6], [7, 8, 9, 10]]


def test_group_key_takes_parameter_values_records_and_plain_values() -> None:
    chunker = AdaptiveChunker(chunked_space(cameras=["L"]))
    chunk = chunker.next_chunk()
    assert chunk is not None
    record = {"Camera": {"type": "STRING", "value": "L"}, "Frame": {"type": "CHUNK[INT]"}}
    assert group_key(chunk, "Frame") == group_key(record, "Frame") == '{"Camera":"L"}'


def test_a_repeated_value_in_the_space_is_still_handed_out_once() -> None:
    space = chunked_space([3, 1, 2, 2], default=2, cameras=["L", "L"])
    got = [plain(c) for c in drain(AdaptiveChunker(space))]
    assert got == [{"Camera": "L", "Frame": "3-3"}, {"Camera": "L", "Frame": "1-2"}]


def test_frames_done_from_an_earlier_attempt_leave_exactly_the_rest() -> None:
    # Attempt 1 takes chunks of changing sizes and reports some frames complete; attempt 2,
    # with different chunk boundaries, runs exactly the frames not yet reported.
    space = chunked_space("1-200", default=5, target=30, cameras=["L", "R"])
    first = AdaptiveChunker(space)
    reported: dict[str, set[int]] = {}
    rng = random.Random(7)
    for _ in range(12):
        chunk = first.next_chunk()
        assert chunk is not None
        frames = frames_of(chunk)
        finished = frames[: rng.randint(0, len(frames))]  # interrupted part way
        reported.setdefault(group_key(chunk, "Frame"), set()).update(finished)
        first.report(len(frames), rng.uniform(0.5, 3.0) * len(frames))
    second = AdaptiveChunker(space, done=reported)
    rest: dict[str, list[int]] = {}
    for chunk in drain(second):
        rest.setdefault(group_key(chunk, "Frame"), []).extend(frames_of(chunk))
    for camera in ("L", "R"):
        key = group_key({"Camera": camera}, "Frame")
        assert sorted(rest.get(key, [])) == sorted(set(range(1, 201)) - reported.get(key, set()))


# --- properties -------------------------------------------------------------------------------


ranges = st.lists(st.integers(-50, 300), min_size=1, max_size=60)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    frames=ranges,
    contiguous=st.booleans(),
    default=st.integers(1, 30),
    cameras=st.sampled_from([None, ["L"], ["L", "R"], ["L", "R", "L"]]),
    done_fraction=st.floats(0, 1),
    timings=st.lists(st.floats(0.001, 200.0), min_size=1, max_size=20),
    max_chunk=st.one_of(st.none(), st.integers(1, 40)),
    seed=st.integers(0, 2**16),
)
def test_every_frame_is_handed_out_once_within_the_range_and_constraint(
    frames: list[int],
    contiguous: bool,
    default: int,
    cameras: list[str] | None,
    done_fraction: float,
    timings: list[float],
    max_chunk: int | None,
    seed: int,
) -> None:
    space = chunked_space(
        frames, default=default, target=60, contiguous=contiguous, cameras=cameras
    )
    rng = random.Random(seed)
    keys = [group_key({"Camera": c} if cameras else {}, "Frame") for c in (cameras or [None])]
    done = {k: {f for f in frames if rng.random() < done_fraction} for k in keys}
    done["{}" if cameras else '{"Camera":"nobody"}'] = {frames[0]}  # a key of no combination
    chunker = AdaptiveChunker(space, done=done, max_chunk_size=max_chunk)
    handed: dict[str, list[int]] = {}
    index = 0
    while True:
        size = chunker.chunk_size
        chunk = chunker.next_chunk()
        if chunk is None:
            break
        got = frames_of(chunk)
        assert 1 <= len(got) <= size
        assert max_chunk is None or len(got) <= max_chunk
        if contiguous:
            lo, hi = got[0], got[-1]
            assert str(chunk["Frame"].value) == f"{lo}-{hi}" and got == list(range(lo, hi + 1))
        handed.setdefault(group_key(chunk, "Frame"), []).extend(got)
        chunker.report(len(got), timings[index % len(timings)] * len(got))
        index += 1
    for key in set(keys):
        expected = set(frames) - done.get(key, set())
        assert sorted(handed.get(key, [])) == sorted(expected)  # none twice, none lost
    assert set(handed) <= set(keys)


def test_several_threads_take_every_frame_once() -> None:
    space = chunked_space("1-3000", default=3, target=5, cameras=["A", "B", "C"])
    chunker = AdaptiveChunker(space)
    taken: list[tuple[str, int]] = []
    lock = threading.Lock()
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        try:
            start.wait()
            while (chunk := chunker.next_chunk()) is not None:
                got = frames_of(chunk)
                with lock:
                    taken.extend((chunk["Camera"].value, f) for f in got)
                chunker.report(len(got), rng.uniform(0.01, 2.0) * len(got))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert len(taken) == len(set(taken)) == 9000
    assert set(taken) == {(c, f) for c in "ABC" for f in range(1, 3001)}
    frames, seconds = chunker.measured
    assert frames == 9000 and seconds > 0
