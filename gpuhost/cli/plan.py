"""`gpuhost plan`: what `gpuhost apply` would change on each host, and why. Changes nothing."""

from __future__ import annotations

import argparse
import json
import sys

from gpuhost.cli.common import add_target_options, positive_int, resolve_targets
from gpuhost.cli.text import make_console
from gpuhost.cli.views import print_plan_outcome
from gpuhost.errors import EXIT_FINDINGS, EXIT_OK, EXIT_UNUSABLE, InputError
from gpuhost.plan.fleet import PlanOutcome, plan_fleet


def configure(parser: argparse.ArgumentParser) -> None:
    add_target_options(parser, snapshots=True)
    parser.add_argument("--json", action="store_true", help="print the plans as JSON (schema gpuhost.plan/1)")
    parser.add_argument("--forks", type=positive_int, default=10, help="hosts read in parallel (default 10)")
    parser.add_argument(
        "--show-files",
        action="store_true",
        help="print every file change of the plan, phase by phase, with the full content of each file written",
    )


def exit_code(outcomes: list[PlanOutcome]) -> int:
    if any(outcome.plan is None for outcome in outcomes):
        return EXIT_UNUSABLE
    return EXIT_FINDINGS if any(outcome.plan and outcome.plan.refusals for outcome in outcomes) else EXIT_OK


def run(args: argparse.Namespace) -> int:
    outcomes = plan_fleet(resolve_targets(args), args.forks)
    if args.json:
        data = [
            outcome.plan.to_json() if outcome.plan else {"host": outcome.host, "error": outcome.error}
            for outcome in outcomes
        ]
        # One write of the finished text: Ctrl-C while json.dump streams would leave half a document.
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    else:
        from gpuhost.rollout.environment import playbook_path

        print_plans(outcomes, show_files=args.show_files)
        try:
            playbook = playbook_path()
        except InputError as error:
            print(f"note: gpuhost apply cannot run: {error}")
        else:
            print(f"gpuhost apply runs {playbook}; without the CLI: ansible-playbook -i INVENTORY {playbook}")
    return exit_code(outcomes)


def print_plans(outcomes: list[PlanOutcome], show_files: bool = False) -> None:
    console = make_console(soft_wrap=True, fixed_width=False)
    for outcome in outcomes:
        print_plan_outcome(outcome, console, show_files=show_files)
        if outcome.plan is not None:
            console.print()
