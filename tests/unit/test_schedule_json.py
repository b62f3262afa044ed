"""The schedule JSON format: round trips and strict, one-line, path-naming errors."""

from __future__ import annotations

import json

import pytest

from traffic.collectives import GENERATORS, make_schedule
from traffic.schedule import ScheduleError
from traffic.schedule_json import FORMAT, dump, dumps, from_dict, load, loads, to_dict


@pytest.mark.parametrize("gen", sorted(GENERATORS))
def test_round_trip_every_generator(gen, tmp_path):
    collective, algorithm = gen
    opts = {"skew": 1.1} if collective == "alltoall" else {}
    s = make_schedule(collective, 5, 4 * 37, chunks=2, seed=4, algorithm=algorithm, **opts)
    assert loads(dumps(s)) == s
    assert loads(dumps(s, indent=2)) == s
    path = tmp_path / "s.json"
    dump(s, path)
    assert load(path) == s
    assert json.loads(path.read_text())["format"] == FORMAT


def base():
    return to_dict(make_schedule("allreduce", 3, 4 * 6))


def err(d) -> str:
    with pytest.raises(ScheduleError) as e:
        from_dict(d)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_malformed_json_text():
    with pytest.raises(ScheduleError, match="invalid JSON at line 1 column") as e:
        loads('{"format": ')
    assert "\n" not in str(e.value)
    with pytest.raises(ScheduleError, match="must be an object, got array"):
        loads("[]")


def test_top_level_fields():
    d = base(); d["format"] = "nccl"
    assert err(d).startswith("format: must be 'testbed-schedule'")
    d = base(); d["version"] = 2
    assert "version: unsupported version 2" in err(d)
    d = base(); del d["ranks"]
    assert "missing key 'ranks'" in err(d)
    d = base(); d["colour"] = "red"
    assert "unknown key 'colour'" in err(d)
    d = base(); d["ranks"] = "3"
    assert err(d).startswith('ranks: must be an integer, got string "3"')
    d = base(); d["count"] = True
    assert err(d).startswith("count: must be an integer, got boolean")
    d = base(); d["dtype"] = "float8"
    assert err(d).startswith("dtype: unsupported dtype 'float8'")
    d = base(); d["collective"] = "allmagic"
    assert "unknown collective 'allmagic'" in err(d)
    d = base(); d["programs"].pop()
    assert err(d).startswith("programs: has 2 entries, ranks is 3")
    d = base(); d["params"] = {"x": [1]}
    assert err(d).startswith("params.x:")


def test_step_fields_are_named_by_path():
    d = base(); d["programs"][1]["steps"][2]["sends"][0]["peer"] = "0"
    assert err(d).startswith('programs[1].steps[2].sends[0].peer: must be an integer, got string "0"')
    d = base(); d["programs"][0]["steps"][1]["recvs"][0]["op"] = "max"
    assert err(d).startswith("programs[0].steps[1].recvs[0].op: must be one of copy, reduce")
    d = base(); d["programs"][0]["steps"][0]["sends"][0]["src"] = ["input", 0]
    assert err(d).startswith("programs[0].steps[0].sends[0].src: must be a [buffer, offset, count] array")
    d = base(); d["programs"][0]["steps"][0]["sends"][0]["src"][2] = 0
    assert err(d).startswith("programs[0].steps[0].sends[0].src[2]: must be >= 1")
    d = base(); d["programs"][2]["steps"][3]["deps"] = [3]
    assert err(d).startswith("programs[2]: rank 2 step 3: dependency 3 is not an earlier step")
    d = base(); d["programs"][0]["steps"][0]["extra"] = 1
    assert err(d).startswith("programs[0].steps[0]: unknown key 'extra'")
    d = base(); d["programs"][1]["buffers"]["output"] = 2
    assert "out of bounds" in err(d)
    d = base(); d["programs"][1]["rank"] = 2
    assert err(d).startswith("programs[1].rank: must be 1")


def test_unmatched_send_in_json():
    d = base()
    step = d["programs"][0]["steps"][0]
    step["sends"][0]["tag"] = 99
    msg = err(d)
    assert msg.startswith("schedule: rank 0 step 0") and "no matching receive" in msg
    d = base()
    d["programs"][1]["steps"][0]["recvs"][0]["dst"][2] = 1
    assert "expects 1" in err(d)


def test_minimal_hand_written_file():
    text = json.dumps(
        {
            "format": "testbed-schedule",
            "version": 1,
            "collective": "broadcast",
            "root": 0,
            "ranks": 2,
            "count": 3,
            "programs": [
                {"rank": 0, "buffers": {"input": 3, "output": 3}, "steps": [
                    {"local": [{"src": ["input", 0, 3], "dst": ["output", 0, 3]}],
                     "sends": [{"peer": 1, "tag": 0, "src": ["input", 0, 3]}]}
                ]},
                {"rank": 1, "buffers": {"input": 3, "output": 3},
                 "steps": [{"recvs": [{"peer": 0, "tag": 0, "dst": ["output", 0, 3]}]}]},
            ],
        }
    )
    s = loads(text)
    assert s.algorithm == "custom" and s.dtype == "float32"
    import numpy as np

    out = s.simulate([np.array([1, 2, 3]), np.zeros(3)])
    assert out[1].tolist() == [1, 2, 3]


def test_load_missing_file_names_it(tmp_path):
    with pytest.raises(ScheduleError, match="nope.json: cannot read"):
        load(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(ScheduleError, match=r"bad.json: invalid JSON"):
        load(bad)


@pytest.mark.parametrize("collective", ["allreduce", "alltoall"])
def test_an_agent_loads_only_its_own_program(collective):
    s = make_schedule(collective, 8, 8 * 4 * 16, chunks=2)
    text = dumps(s)
    mine = loads(text, for_rank=3)
    assert mine.programs[3] == s.programs[3]
    assert all(p.steps == () and p.buffers == s.programs[r].buffers for r, p in enumerate(mine.programs) if r != 3)
    assert mine.bytes_sent(3) == s.bytes_sent(3) and mine.bytes_received(3) == s.bytes_received(3)
    assert (mine.collective, mine.count, mine.ranks, mine.dtype) == (s.collective, s.count, s.ranks, s.dtype)


def test_per_rank_files_hold_what_one_agent_loads(tmp_path):
    from traffic.schedule_json import dump_for_ranks

    s = make_schedule("allreduce", 6, 6 * 4 * 8)
    pattern = dump_for_ranks(s, tmp_path, "schedule-a")
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"schedule-a.rank{r}.json" for r in range(6)]
    for r in range(6):
        mine = load(tmp_path / pattern.format(rank=r), for_rank=r)
        assert mine.programs[r] == s.programs[r] and mine.bytes_sent(r) == s.bytes_sent(r)
    assert (tmp_path / "schedule-a.rank2.json").stat().st_size < 0.5 * len(dumps(s))
