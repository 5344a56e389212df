"""Summarise what sitecustomize.py (CENSUS_LOG) or cpuplug.py (CPUPLUG_LOG) wrote.

    python bench/suite_census/summary.py census /tmp/census.jsonl
    python bench/suite_census/summary.py tests /tmp/cpu.jsonl
"""

import argparse
import collections
import json


def kind_of(command: list[str]) -> str:
    """``-m module`` (with llava-norm's subcommand), ``-c``, or the script's name."""
    args = [a for a in command[1:] if a != "-u"]
    if args[:1] == ["-m"]:
        module = args[1] if len(args) > 1 else "?"
        return f"{module} {args[2]}" if module == "llava_norm.cli" and len(args) > 2 else module
    return "-c" if args[:1] == ["-c"] else (args[0].rsplit("/", 1)[-1] if args else "python")


def census(lines: list[dict]) -> None:
    processes = collections.defaultdict(dict)
    for line in lines:
        processes[line["pid"]][line["kind"]] = line
    kinds = collections.defaultdict(lambda: {"processes": 0, "cpu_s_of_those_that_exited": 0.0, "killed": 0})
    for seen in processes.values():
        row = kinds[kind_of((seen.get("start") or seen["exit"])["command"])]
        row["processes"] += 1
        if "exit" in seen:
            row["cpu_s_of_those_that_exited"] += seen["exit"]["cpu"]
        else:
            row["killed"] += 1
    for kind, row in sorted(kinds.items(), key=lambda item: -item[1]["cpu_s_of_those_that_exited"]):
        print(f"{kind:25s} {row['processes']:4d} processes {row['cpu_s_of_those_that_exited']:7.0f} CPU-s "
              f"(exited), {row['killed']} killed")


def tests(lines: list[dict]) -> None:
    start = min(line["start"] for line in lines)
    end = max(line["start"] + line["wall"] for line in lines)
    print(f"{len(lines)} tests, {sum(line['own'] + line['children'] for line in lines):.0f} CPU-s "
          f"(their own and their reaped launches'), first start to last end {end - start:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["census", "tests"])
    parser.add_argument("log")
    args = parser.parse_args()
    with open(args.log) as log:
        lines = [json.loads(line) for line in log if line.strip()]
    (census if args.what == "census" else tests)(lines)


if __name__ == "__main__":
    main()
