"""Every `testbed run` / `sweep` / `cli` / `audit` / `budget` / `jobs` / `lab` command shown in the README, docs/ and
the classroom labs' handouts (code blocks and inline commands) resolves and validates: a reader who copies one gets a
run, not a usage error (pure parameter logic, nothing is built)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from testbed.params import resolve
from testbed.scenario import get

ROOT = Path(__file__).resolve().parents[2]


COMMAND = re.compile(r"(sudo )?testbed (run|sweep) [a-z]|(sudo )?testbed (cli|audit|budget|jobs)\b"
                     r"|(sudo )?testbed lab (show|run)")


def _commands() -> list[tuple[str, str]]:
    out = []
    handouts = sorted((ROOT / "labs").glob("*/README.md")) + [ROOT / "labs" / "README.md"]
    for f in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *handouts]:
        text = f.read_text()
        lines = []
        for block in re.findall(r"```sh\n(.*?)```", text, re.S):
            lines += [ln.split(" #", 1)[0].strip() for ln in block.replace("\\\n", " ").splitlines()]
        if f in handouts:  # the handouts quote commands inline too, sometimes wrapped over two lines
            lines += [" ".join(c.split()) for c in re.findall(r"`((?:sudo )?testbed [^`]+)`", text)]
        for line in lines:
            if COMMAND.match(line) and "<" not in line and "N" not in line.split()[-1:]:
                out.append((f"{f.parent.name}/{f.name}: {line}", line))
    return out


COMMANDS = _commands()


def test_the_docs_show_commands():
    assert len(COMMANDS) >= 15, COMMANDS


@pytest.mark.parametrize("line", [c[1] for c in COMMANDS], ids=[c[0][:90] for c in COMMANDS])
def test_documented_command_validates(line, tmp_path):
    if "schedule_file=my_schedule.json" in line:  # the docs' placeholder: a schedule the reader exported
        from traffic.collectives import make_schedule
        from traffic.schedule_json import dump

        dump(make_schedule("allreduce", 4, 4096), tmp_path / "my_schedule.json")
        line = line.replace("my_schedule.json", str(tmp_path / "my_schedule.json"))
    line = line.replace("=examples/", f"={ROOT}/examples/")  # files the repository ships, wherever pytest runs
    argv = shlex.split(line)
    argv = argv[argv.index("testbed") + 1:]
    if argv[0] == "lab":  # testbed lab show|run N: the lab exists and loads
        from testbed.commands import labs as classlabs

        classlabs.find(argv[2])
        return
    if argv[0] == "audit":  # testbed audit: its parser and the plan it would run
        from testbed.commands import audit
        from testbed.cli import build_parser

        args = build_parser().parse_args(argv)
        audit.plan(get("collective"), args.set, audit.parse_scale(args.scale), args.scaling)
        return
    if argv[0] == "budget":  # testbed budget: its parser and the plan it would run
        from testbed.commands import budget
        from testbed.cli import build_parser

        args = build_parser().parse_args(argv)
        budget.plan(get("collective"), args.set, budget.parse_values(args.jitter, "--jitter", 1.0, False),
                    budget.parse_values(args.straggler_prob or "", "--straggler-prob", 1.0, True))
        return
    if argv[0] == "jobs":  # testbed jobs FILE: its parser and the jobs file, read, checked and placed
        from testbed.cli import build_parser
        from testbed.commands import jobsfile

        args = build_parser().parse_args(argv)
        jobsfile.load(ROOT / args.file, get("collective").params, args.seed)
        return
    if argv[0] == "cli":  # testbed cli: its parser and the topology it would build
        from testbed.cli import build_parser
        from testbed.commands.explore import build_topology

        args = build_parser().parse_args(argv)
        if args.topology and not Path(args.topology).exists():
            return  # the docs' placeholder file
        build_topology(args).links
        return
    verb, name, rest = argv[0], argv[1], argv[2:]
    if "--help" in rest or name.startswith("-"):
        return
    scenario = get(name)
    sets = [rest[i + 1] for i, a in enumerate(rest) if a == "--set"]
    if verb == "sweep":  # one point per value of the swept (comma-listed) parameter
        swept = [s for s in sets if "," in s.split("=", 1)[1] and s.split("=", 1)[0] not in ("background", "size",
                                                                                            "buckets", "stragglers")]
        assert swept, line
        k, vals = swept[0].split("=", 1)
        points = [[s if s != swept[0] else f"{k}={v}" for s in sets] for v in vals.split(",")]
    else:
        points = [sets]
    faults = [rest[i + 1] for i, a in enumerate(rest) if a == "--fault"]
    for pt in points:
        params = resolve(scenario.params, pt)
        scenario.validate(params)
        if faults:  # the timeline parses and fits the topology it would run on
            from testbed.commands.runner import parse_faults

            parse_faults(scenario, params, 1, faults, None)
