"""Command-line entry points (absl flags), installed as console scripts by `pip install -e .`.

Each module defines its flags at import and a `run()` entry point; `experiments/*.py` run
the same modules as scripts. Only these modules read flags (the library never does).
"""
from __future__ import annotations

import contextlib
import functools
import os
import shlex
import sys
import tempfile
import time
import traceback

# Where a command writes the traceback of an unexpected exception: set by the command once it
# knows its run (or sweep) directory (`set_error_dir`); a temporary file otherwise.
_error_dir: str | None = None


def set_error_dir(path: str) -> None:
    global _error_dir
    _error_dir = path


def rerun_command(argv: list[str] | None = None) -> str:
    """The command line that started this process, as a user would type it again."""
    argv = list(sys.argv if argv is None else argv)
    head = ["python", argv[0]] if argv[0].endswith(".py") else [os.path.basename(argv[0])]
    return shlex.join(head + argv[1:])


def write_traceback(exc: BaseException) -> str:
    """The full traceback of `exc` in <error dir>/crash-<UTC time>-<pid>.txt (a temporary
    file when there is no error dir or it cannot be written); returns its path."""
    text = (f"command: {rerun_command()}\n"
            + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
    name = f"crash-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{os.getpid()}.txt"
    if _error_dir:
        try:
            path = os.path.join(_error_dir, name)
            with open(path, "w") as f:
                f.write(text)
            return path
        except OSError:
            pass
    fd, path = tempfile.mkstemp(prefix="jaxrl_scale-crash-", suffix=".txt")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path


def _first_line(exc: BaseException, n: int = 300) -> str:
    lines = str(exc).strip().splitlines()
    s = lines[0] if lines else ""
    return s if len(s) <= n else s[:n] + "..."


def guarded(main, defer_sigint: bool = False):
    """`main` as every command's top level runs it: a Ctrl-C ends it with one line saying how
    to resume and exit 130 (with defer_sigint, the first Ctrl-C only asks the training loop
    to stop at its next clean point: interrupt.py); an error of the run's environment that
    already says what to do (disk full, a damaged checkpoint or metrics file) is one line and
    exit 1; any other exception is a bug: one line naming the file its traceback was written
    to, and exit 1. ConfigError (exit 2) is the commands' own `one_line_errors`."""
    from jaxrl_scale import interrupt

    @functools.wraps(main)
    def wrapped(argv):
        from jaxrl_scale.checkpoint import CheckpointError, is_disk_full
        from jaxrl_scale.experiment.metrics import CorruptMetricsError
        with interrupt.deferred_sigint() if defer_sigint else contextlib.nullcontext():
            try:
                return main(argv)
            except KeyboardInterrupt as e:   # interrupt.Interrupted, or a plain Ctrl-C
                what = f"interrupted: {_first_line(e)}" if str(e) else "interrupted"
                print(f"\n{what}. To resume, rerun the same command: {rerun_command()}",
                      file=sys.stderr, flush=True)
                sys.exit(interrupt.EXIT_CODE)
            except Exception as e:  # noqa: BLE001 -- the top level: anything else is a bug
                if isinstance(e, (CheckpointError, CorruptMetricsError)) or is_disk_full(e):
                    print(f"error: {_first_line(e, 2000)}", file=sys.stderr, flush=True)
                    sys.exit(1)
                path = write_traceback(e)
                print(f"error: unexpected {type(e).__name__}: {_first_line(e)} (full "
                      f"traceback in {path}). This is a bug: please report it.",
                      file=sys.stderr, flush=True)
                sys.exit(1)
    return wrapped


def run_main(main, module_name: str, *, defer_sigint: bool = False) -> None:
    """absl's app.run(main) for a console script, through `guarded`: `--help` shows this
    module's flags and docstring (absl lists the flags of the module it sees as __main__,
    the installed wrapper script, not the module that defined them). defer_sigint: the
    command's loops poll interrupt.requested() (train, sweep, sft)."""
    from absl import app, flags
    module = sys.modules[module_name]
    # flagdefs (and this module) define flags on behalf of the one command imported in a process
    for owner in (module_name, "jaxrl_scale.cli.flagdefs", __name__):
        for flag in flags.FLAGS.get_flags_for_module(owner):
            flags.FLAGS.register_flag_by_module(sys.argv[0], flag)
    main_mod = sys.modules.get("__main__")
    if main_mod is not None and main_mod is not module:
        main_mod.__doc__ = module.__doc__
    app.run(guarded(main, defer_sigint))


@contextlib.contextmanager
def one_line_errors():
    """A ConfigError (a bad input) ends the command with `error: <field>: <problem>. Fix:
    <fix>.` on stderr and exit status 2, like absl's own flag errors; anything else is a bug
    and keeps its traceback."""
    from jaxrl_scale.experiment.errors import ConfigError
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
    from jaxrl_scale.report import facts, format_table
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


def define_distributed_flags() -> None:
    """--coordinator_address, --num_processes, --process_id, --distributed_auto: how the
    processes of one multi-process run find each other (launch settings, not part of the
    run's config: a run may resume with another process count)."""
    from absl import flags
    flags.DEFINE_string("coordinator_address", "",
                        "Multi-process run: host:port of process 0's coordinator (every process "
                        "passes the same address).")
    flags.DEFINE_integer("num_processes", 1, "Multi-process run: how many processes (one per "
                         "host); 1 is a single-process run.")
    flags.DEFINE_integer("process_id", 0, "Multi-process run: this process's index, 0 .. "
                         "num_processes - 1.")
    flags.DEFINE_bool("distributed_auto", False,
                      "Multi-process run: jax.distributed.initialize() reads the cluster's "
                      "environment (Cloud TPU pods, SLURM, Open MPI); the flags above override "
                      "what it detects.")


def check_distributed(address: str, num_processes: int, process_id: int, auto: bool) -> None:
    """ConfigError for settings `jaxrl_scale.distributed.initialize` cannot start from."""
    from jaxrl_scale.experiment.errors import ConfigError
    if num_processes < 1:
        raise ConfigError("num_processes", f"must be >= 1, got {num_processes}",
                          "use 1 for a single process, or the number of processes")
    if auto:
        return
    if num_processes == 1:
        if address:
            raise ConfigError("num_processes", f"is 1, but --coordinator_address={address} "
                              "asks for a multi-process run", "set --num_processes to the "
                              "number of processes (and --process_id on each)")
        if process_id:
            raise ConfigError("process_id", f"{process_id} in a single-process run",
                              "set --num_processes too, or drop --process_id")
        return
    host, _, port = address.rpartition(":")
    if not (host and port.isdigit() and 0 < int(port) < 65536):
        raise ConfigError("coordinator_address", f"{address!r} is not host:port",
                          "pass process 0's address and a free port, e.g. "
                          "--coordinator_address=10.0.0.1:1234 (or --distributed_auto on "
                          "TPU pods, SLURM, Open MPI)")
    if not 0 <= process_id < num_processes:
        raise ConfigError("process_id", f"{process_id} is outside 0 .. {num_processes - 1}",
                          f"give each of the {num_processes} processes its own index in "
                          f"0 .. {num_processes - 1}")


def init_distributed() -> None:
    """Check the distributed flags (one line on bad input) and join the run's processes;
    before anything touches a device."""
    from absl import flags
    from jaxrl_scale import distributed
    F = flags.FLAGS
    check_distributed(F.coordinator_address, F.num_processes, F.process_id, F.distributed_auto)
    if F.distributed_auto:    # only the flags given override what the cluster says
        distributed.initialize(F.coordinator_address,
                               F.num_processes if F["num_processes"].present else None,
                               F.process_id if F["process_id"].present else None, auto=True)
    else:
        distributed.initialize(F.coordinator_address, F.num_processes, F.process_id)


# ---------------------------------------------------------------------------------------------
# Flag checks of the benchmarks (cli/*_bench.py): the same one-line errors as the commands,
# through the same range checker as TrainConfig (experiment.config.check_ranges: finite,
# typed, in range), before any model is built or timed.

INF = float("inf")


def check_flag_ranges(ranges: dict, ints=()) -> None:
    """ConfigError for the first flag outside its (lowest, highest, lowest excluded) range."""
    from absl import flags
    from jaxrl_scale.experiment.config import check_ranges
    F = flags.FLAGS
    check_ranges({k: F[k].value for k in ranges if F[k].value is not None}, ranges, set(ints))


def int_list_flag(name: str, lowest: int = 1) -> list[int]:
    """The comma-separated integers of --name, each >= lowest, at least one."""
    from absl import flags
    from jaxrl_scale.experiment.errors import ConfigError
    raw = flags.FLAGS[name].value
    try:
        values = [int(x) for x in raw]
    except ValueError:
        raise ConfigError(name, f"{','.join(raw)!r} is not a list of integers",
                          f"pass e.g. --{name}=1,2,4") from None
    if not values or min(values) < lowest:
        raise ConfigError(name, f"needs integers >= {lowest}, got {','.join(raw) or 'none'}",
                          f"pass e.g. --{name}=1,2,4")
    return values


def check_choice(name: str, value: str, choices) -> None:
    from jaxrl_scale.experiment.errors import ConfigError
    if value not in choices:
        raise ConfigError(name, f"{value!r} is not one of {sorted(choices)}",
                          f"pass --{name}=<one of them>")


def check_model_preset(name: str = "model") -> None:
    from absl import flags
    from jaxrl_scale.models.config import PRESETS
    check_choice(name, flags.FLAGS[name].value, PRESETS)


def check_json_out(name: str = "json_out") -> None:
    """--name must be a file path whose nearest existing parent is a writable directory."""
    import os
    from absl import flags
    from jaxrl_scale.experiment.errors import ConfigError
    path = flags.FLAGS[name].value
    if not path:
        return
    if os.path.isdir(path):
        raise ConfigError(name, f"{path!r} is a directory", "pass a file path, e.g. out.json")
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not (os.path.isdir(parent) and os.access(parent, os.W_OK | os.X_OK)):
        raise ConfigError(name, f"cannot write under {parent!r}", "choose a writable path")


def write_json_out(out: dict, name: str = "json_out", **kw) -> None:
    """Write a benchmark's record to --name (its folder made first) and say where; nothing
    when the flag is empty."""
    import os
    from absl import flags
    from jaxrl_scale.numbers import write_json
    path = flags.FLAGS[name].value
    if not path:
        return
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    write_json(path, out, indent=2, **kw)
    print(f"wrote {path}")
