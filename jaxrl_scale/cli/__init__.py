"""Command-line entry points (absl flags), installed as console scripts by `pip install -e .`.

Each module defines its flags at import and a `run()` entry point; `experiments/*.py` run
the same modules as scripts. Only these modules read flags (the library never does).
"""
from __future__ import annotations

import contextlib
import sys


def run_main(main, module_name: str) -> None:
    """absl's app.run(main) for a console script: `--help` shows this module's flags and
    docstring (absl lists the flags of the module it sees as __main__, the installed
    wrapper script, not the module that defined them)."""
    from absl import app, flags
    module = sys.modules[module_name]
    # flagdefs defines the config flags on behalf of the one command imported in a process
    for owner in (module_name, "jaxrl_scale.cli.flagdefs"):
        for flag in flags.FLAGS.get_flags_for_module(owner):
            flags.FLAGS.register_flag_by_module(sys.argv[0], flag)
    main_mod = sys.modules.get("__main__")
    if main_mod is not None and main_mod is not module:
        main_mod.__doc__ = module.__doc__
    app.run(main)


@contextlib.contextmanager
def one_line_errors():
    """A ConfigError (a bad input) ends the command with `error: <field>: <problem>. Fix:
    <fix>.` on stderr and exit status 2, like absl's own flag errors; anything else is a bug
    and keeps its traceback."""
    from jaxrl_scale.experiment.config import ConfigError
    try:
        yield
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        sys.exit(2)


def quiet_logging() -> None:
    """Library INFO logs (orbax writes ~80 lines per sweep run) off unless --verbosity is
    given, so progress bars and one line per finished run stay readable."""
    from absl import flags, logging
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)


def print_summary(summary: dict) -> None:
    """The analysis answer on the terminal: the report's first lines (facts), the table, then
    warnings, skipped directories and failed runs on stderr, and where the files are."""
    from jaxrl_scale.experiment.report import facts, format_table
    for s in facts(summary):
        print(f"- {s}")
    print()
    print(format_table(summary))
    for w in summary.get("warnings", []):
        print(f"warning: {w}", file=sys.stderr)
    for s in summary.get("skipped", []):
        print(f"skipped: {s['dir']}: {s['reason']}", file=sys.stderr)
    for name, err in summary.get("errors", {}).items():
        print(f"run {name} failed: {err}", file=sys.stderr)
    print(f"\nwrote {summary['summary_path']} and {summary['report_path']}")
