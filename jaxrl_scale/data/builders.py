"""TFDS builders for the verifiable tasks, written as array_record and read back with
`as_data_source()` (random access, no TensorFlow), and `load_task`, the one-call entry.

    src = load_task("arithmetic", "train", data_dir="/tmp/tasks", num_examples=1000, digits=3)
    src[0]  # {"prompt": "512+77=", "answer": "589", "solution": "589", "id": 0}

Every knob lives in a BuilderConfig; the config's name encodes all of them, so each distinct
configuration is built once and cached under data_dir/<task>/<config name>/<version>.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import logging
import os
from typing import Any, Iterator

import numpy as np
import tensorflow_datasets as tfds

from jaxrl_scale.data import tasks as _tasks

__all__ = [
    "ArithChain",
    "ArithChainConfig",
    "Arithmetic",
    "ArithmeticConfig",
    "Countdown",
    "CountdownConfig",
    "MathJsonl",
    "MathJsonlConfig",
    "TaskSource",
    "TASKS",
    "load_task",
]

_SPLITS = ("train", "test")


class _DropCustomConfigWarning(logging.Filter):
    """Every load_task config is a custom BuilderConfig by design; TFDS warns about each one."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        return not (
            str(record.msg).startswith("Using custom data configuration")
            and any(type(a).__module__ == __name__ for a in args)
        )


logging.getLogger("absl").addFilter(_DropCustomConfigWarning())


@contextlib.contextmanager
def _no_progress_bar():
    from tensorflow_datasets.core.utils import tqdm_utils

    old = getattr(tqdm_utils, "_active", True)
    tfds.display_progress_bar(False)
    try:
        yield
    finally:
        tfds.display_progress_bar(old)


def _text_features(**extra: Any) -> tfds.features.FeaturesDict:
    return tfds.features.FeaturesDict(
        {
            "prompt": tfds.features.Text(),
            "answer": tfds.features.Text(),
            "solution": tfds.features.Text(),
            "id": np.int64,
            **extra,
        }
    )


@dataclasses.dataclass
class _GeneratedSplits(tfds.core.BuilderConfig):
    """Knobs every generated task shares: split sizes, the held-out share, the seed."""

    seed: int = 0
    num_train: int = 20_000
    num_test: int = 500
    test_fraction: float = 0.1


def _knob_fields(cfg_cls: type) -> dict[str, dataclasses.Field]:
    """A config's own fields, the task's first and the shared split knobs last (the order
    of the dataset directory name)."""
    base = {f.name for f in dataclasses.fields(tfds.core.BuilderConfig)}
    shared = [f.name for f in dataclasses.fields(_GeneratedSplits) if f.name not in base]
    fields = {f.name: f for f in dataclasses.fields(cfg_cls) if f.name not in base}
    order = [n for n in fields if n not in shared] + [n for n in shared if n in fields]
    return {n: fields[n] for n in order}


def _slug(v: Any) -> str:
    """A directory-name-safe rendering of a knob value ("+-*" -> "addsubmul", 0.1 -> "0p1")."""
    s = "".join(_tasks.OP_NAMES.get(c, c) for c in v) if isinstance(v, str) else str(v)
    s = s.replace(".", "p")
    if not s or not all(c.isalnum() or c in "_-" for c in s):
        s = hashlib.sha1(repr(v).encode()).hexdigest()[:8]
    return s


class _TaskBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """Shared pieces: config construction from knobs, and info with generation-order storage."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Initial release."}
    CONFIG_CLS: type = tfds.core.BuilderConfig
    NUM_EXAMPLES_FIELD = {"train": "num_train", "test": "num_test"}

    # Nothing is downloaded, so there is no checksums file to locate. TFDS finds it through
    # `code_path`, whose lookup needs the `importlib_resources` backport TFDS does not declare.
    @tfds.core.utils.classproperty
    @classmethod
    def code_path(cls):
        return None

    @classmethod
    def knobs(cls) -> dict[str, Any]:
        """Knob names and default values."""
        return {k: f.default for k, f in _knob_fields(cls.CONFIG_CLS).items()}

    @classmethod
    def make_config(cls, **knobs: Any) -> tfds.core.BuilderConfig:
        valid = cls.knobs()
        unknown = sorted(set(knobs) - set(valid))
        if unknown:
            raise ValueError(
                f"{cls.name}: unknown option(s) {unknown}; valid options: {sorted(valid)}"
            )
        values = {**valid, **knobs}
        return cls.CONFIG_CLS(name=cls._config_name(values), **values)

    @classmethod
    def _config_name(cls, values: dict[str, Any]) -> str:
        parts = [f"{k}-{_slug(v)}" for k, v in values.items()]
        name = "_".join(parts)
        if len(name) > 120:
            name = name[:100] + "_" + hashlib.sha1(name.encode()).hexdigest()[:12]
        return name

    def _features(self) -> tfds.features.FeaturesDict:
        return _text_features()

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description=(self.__doc__ or "").strip().splitlines()[0],
            features=self._features(),
            # Keep generation order, so example i has id i and a smaller split is a prefix.
            disable_shuffling=True,
        )

    def _validate(self) -> None:
        """Raise ValueError for a bad config before anything is generated."""

    def _examples(self, split: str) -> list[dict[str, Any]]:
        raise NotImplementedError

    def _split_generators(self, dl_manager: tfds.download.DownloadManager):
        self._validate()
        return {split: self._generate_examples(split) for split in self._splits()}

    def _splits(self) -> tuple[str, ...]:
        """Splits to build: those with a non-zero size (load_task builds one split per config)."""
        c = self.builder_config
        return tuple(s for s in _SPLITS if getattr(c, self.NUM_EXAMPLES_FIELD[s]) != 0)

    def _generate_examples(self, split: str) -> Iterator[tuple[int, dict[str, Any]]]:
        for i, ex in enumerate(self._examples(split)):
            yield i, {**ex, "id": i}

    def _sample_split(self, task: str, make, split: str) -> list[dict[str, Any]]:
        """`split`'s examples from the generator `make(rng)`, sized and seeded by the config."""
        c = self.builder_config
        return _tasks.sample_split(task, make, split=split,
                                   n=getattr(c, self.NUM_EXAMPLES_FIELD[split]), seed=c.seed,
                                   test_fraction=c.test_fraction)


@dataclasses.dataclass
class ArithmeticConfig(_GeneratedSplits):
    """Knobs of the arithmetic task: see tasks.ArithmeticSpec."""

    digits: int = 2
    ops: str = "+-*"
    num_operands: int = 2


class Arithmetic(_TaskBuilder, skip_registration=True):
    """Multi-digit arithmetic: prompt "23+58=", answer "81"; held-out problems never in train."""

    CONFIG_CLS = ArithmeticConfig
    BUILDER_CONFIGS = [ArithmeticConfig(name="default")]

    def _spec(self) -> _tasks.ArithmeticSpec:
        c = self.builder_config
        return _tasks.ArithmeticSpec(digits=c.digits, ops=c.ops, num_operands=c.num_operands)

    def _validate(self) -> None:
        c = self.builder_config
        spec = self._spec()
        spec.validate()
        for split in _SPLITS:
            n = getattr(c, self.NUM_EXAMPLES_FIELD[split])
            frac = c.test_fraction if split == "test" else 1.0 - c.test_fraction
            pool = spec.num_problems() * frac
            if n > 0.9 * pool:
                raise ValueError(
                    f"arithmetic: {n} {split} examples requested but digits={c.digits}, "
                    f"ops={c.ops!r}, num_operands={c.num_operands} leave only about {int(pool)} "
                    f"distinct {split} problems; ask for fewer or make the task harder"
                )

    def _examples(self, split: str) -> list[dict[str, Any]]:
        spec = self._spec()
        return self._sample_split("arithmetic", lambda rng: _tasks.arithmetic_problem(rng, spec), split)


@dataclasses.dataclass
class ArithChainConfig(_GeneratedSplits):
    """Knobs of the arithmetic-chain task: see tasks.ArithChainSpec. `digits` and `ops` are
    the arithmetic task's, so the main job's task_kwargs fit both tasks."""

    digits: int = 2
    ops: str = "+-"
    min_ops: int = 1
    max_ops: int = 6
    ops_decay: float = 0.7


class ArithChain(_TaskBuilder, skip_registration=True):
    """Arithmetic chains with shown work: prompt "12+7-5=", solution "19-5=14", answer "14";
    1-6 operations, geometrically fewer long ones, so response lengths have a long tail."""

    CONFIG_CLS = ArithChainConfig
    BUILDER_CONFIGS = [ArithChainConfig(name="default")]

    def _features(self) -> tfds.features.FeaturesDict:
        return _text_features(num_ops=np.int64)

    def _spec(self) -> _tasks.ArithChainSpec:
        c = self.builder_config
        return _tasks.ArithChainSpec(digits=c.digits, ops=c.ops, min_ops=c.min_ops,
                                     max_ops=c.max_ops, ops_decay=c.ops_decay)

    def _validate(self) -> None:
        self._spec().validate()

    def _examples(self, split: str) -> list[dict[str, Any]]:
        spec = self._spec()
        return self._sample_split("arith_chain",
                                  lambda rng: _tasks.arith_chain_problem(rng, spec), split)


@dataclasses.dataclass
class CountdownConfig(_GeneratedSplits):
    """Knobs of the countdown task: see tasks.CountdownSpec."""

    min_numbers: int = 3
    max_numbers: int = 4
    max_number: int = 25
    min_target: int = 10
    max_target: int = 100


class Countdown(_TaskBuilder, skip_registration=True):
    """Countdown: "nums 3 7 25 target 46:" -> an expression with + - * equal to the target,
    each number used at most once. `solution` is the shortest expression found by brute force;
    only solvable instances are generated."""

    CONFIG_CLS = CountdownConfig
    BUILDER_CONFIGS = [CountdownConfig(name="default")]

    def _features(self) -> tfds.features.FeaturesDict:
        return _text_features(numbers=tfds.features.Text())

    def _spec(self) -> _tasks.CountdownSpec:
        c = self.builder_config
        return _tasks.CountdownSpec(
            min_numbers=c.min_numbers,
            max_numbers=c.max_numbers,
            max_number=c.max_number,
            min_target=c.min_target,
            max_target=c.max_target,
        )

    def _validate(self) -> None:
        self._spec().validate()

    def _examples(self, split: str) -> list[dict[str, Any]]:
        spec = self._spec()
        return self._sample_split("countdown", lambda rng: _tasks.countdown_problem(rng, spec), split)


@dataclasses.dataclass
class MathJsonlConfig(tfds.core.BuilderConfig):
    """Knobs of the JSONL math task. num_train / num_test of -1 keep every row."""

    manual_dir: str = ""
    train_file: str = "train.jsonl"
    test_file: str = "test.jsonl"
    num_train: int = -1
    num_test: int = -1
    seed: int = 0  # unused: rows keep file order; accepted so load_task's seed is uniform
    content_hash: str = ""  # filled by load_task so edited files get a fresh cache entry


class MathJsonl(_TaskBuilder, skip_registration=True):
    """GSM8K/MATH-style JSONL from a local directory (manual_dir): question/answer rows with a
    GSM8K "#### 42" final answer, or problem/solution rows with a \\boxed{} answer."""

    CONFIG_CLS = MathJsonlConfig
    BUILDER_CONFIGS = [MathJsonlConfig(name="default")]
    MANUAL_DOWNLOAD_INSTRUCTIONS = (
        "Put train.jsonl and/or test.jsonl (GSM8K question/answer or MATH problem/solution rows) "
        "in a directory and pass it as manual_dir (load_task(..., manual_dir=DIR) or "
        "tfds.download.DownloadConfig(manual_dir=DIR))."
    )

    @classmethod
    def _config_name(cls, values: dict[str, Any]) -> str:
        key = repr(sorted(values.items()))
        n = f"train{values['num_train']}_test{values['num_test']}"
        return f"{n}_{hashlib.sha1(key.encode()).hexdigest()[:16]}"

    def _manual_dir(self, dl_manager: tfds.download.DownloadManager | None = None) -> str:
        d = self.builder_config.manual_dir
        if not d and dl_manager is not None:
            try:
                d = os.fspath(dl_manager.manual_dir)
            except Exception:  # TFDS asserts when its default manual dir is missing
                d = ""
        return _check_manual_dir(d)

    def _file(self, split: str) -> str:
        c = self.builder_config
        return c.train_file if split == "train" else c.test_file

    def _split_generators(self, dl_manager: tfds.download.DownloadManager):
        d = self._manual_dir(dl_manager)
        self._dir = d
        files = {s: os.path.join(d, self._file(s)) for s in self._splits()}
        present = {s: p for s, p in files.items() if os.path.isfile(p)}
        if not present:
            raise ValueError(
                f"math_jsonl: manual_dir {d!r} holds none of "
                f"{sorted(os.path.basename(p) for p in files.values())}"
            )
        return {s: self._generate_examples(s) for s in present}

    def _examples(self, split: str) -> list[dict[str, Any]]:
        n = getattr(self.builder_config, self.NUM_EXAMPLES_FIELD[split])
        out = []
        for row in _tasks.iter_math_jsonl(os.path.join(self._dir, self._file(split))):
            if 0 <= n <= len(out):
                break
            out.append(row)
        return out


def _check_manual_dir(d: str) -> str:
    if not d:
        raise ValueError(
            "math_jsonl needs a data directory: set manual_dir (load_task('math_jsonl', split, "
            "data_dir=..., manual_dir=DIR), or --manual_dir in the experiment scripts) to a "
            "directory holding train.jsonl / test.jsonl"
        )
    if not os.path.isdir(d):
        raise ValueError(
            f"math_jsonl: manual_dir {d!r} does not exist or is not a directory; set manual_dir "
            "to a directory holding train.jsonl / test.jsonl"
        )
    return d


TASKS: dict[str, type[_TaskBuilder]] = {
    "arithmetic": Arithmetic,
    "arith_chain": ArithChain,
    "countdown": Countdown,
    "math_jsonl": MathJsonl,
}


class TaskSource:
    """Random-access examples of one split: `len(src)`, `src[i]` -> dict of str (and int "id").

    Wraps the TFDS array_record data source and decodes its bytes to str.
    """

    def __init__(self, data_source: Any, *, task: str, split: str, config: Any) -> None:
        self._ds = data_source
        self.task = task
        self.split = split
        self.config = config

    def __len__(self) -> int:
        return len(self._ds)

    @staticmethod
    def _decode(ex: dict[str, Any]) -> dict[str, Any]:
        out = {}
        for k, v in ex.items():
            if isinstance(v, bytes):
                v = v.decode("utf-8")
            elif isinstance(v, np.generic):
                v = v.item()
            out[k] = v
        return out

    def __getitem__(self, i: int) -> dict[str, Any]:
        n = len(self)
        i = int(i)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"index {i} out of range for {self.task}/{self.split} of size {n}")
        return self._decode(self._ds[i])

    def get_many(self, indices: list[int]) -> list[dict[str, Any]]:
        indices = [int(i) for i in indices]
        if hasattr(self._ds, "__getitems__"):
            return [self._decode(ex) for ex in self._ds.__getitems__(indices)]
        return [self[i] for i in indices]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for i in range(len(self)):
            yield self[i]

    def __repr__(self) -> str:
        return (
            f"TaskSource({self.task!r}, {self.split!r}, n={len(self)}, "
            f"config={self.config.name!r})"
        )


def _hash_files(d: str, names: list[str]) -> str:
    h = hashlib.sha1()
    for name in names:
        p = os.path.join(d, name)
        h.update(name.encode() + b"\0")
        if os.path.isfile(p):
            with open(p, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
        h.update(b"\1")
    return h.hexdigest()[:16]


class _ConfigView:
    """The two things a builder's `_spec` / `_validate` read (its config and split fields),
    so options are checked without constructing a TFDS builder (which touches data_dir)."""

    def __init__(self, cls: type, config: tfds.core.BuilderConfig):
        self.cls, self.builder_config = cls, config
        self.NUM_EXAMPLES_FIELD = cls.NUM_EXAMPLES_FIELD

    def _spec(self):
        return self.cls._spec(self)


def check_task_options(name: str, *, num_train: int | None = None, num_test: int | None = None,
                       **knobs: Any) -> None:
    """Raise ValueError for an unknown task, an unknown option or a bad option value, as
    `load_task` would, but before anything is built or read."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known tasks: {sorted(TASKS)}")
    cls = TASKS[name]
    sizes = {f: n for f, n in zip(cls.NUM_EXAMPLES_FIELD.values(), (num_train, num_test))
             if n is not None}
    config = cls.make_config(**knobs, **sizes)
    if cls is MathJsonl:
        _check_manual_dir(os.path.expanduser(os.fspath(knobs.get("manual_dir") or "")))
    else:
        cls._validate(_ConfigView(cls, config))


def load_task(
    name: str,
    split: str,
    *,
    data_dir: str | os.PathLike,
    seed: int = 0,
    num_examples: int | None = None,
    **knobs: Any,
) -> TaskSource:
    """Build (once, cached in data_dir by config) and open one split of a task.

    name: one of TASKS. split: "train" or "test" (held out). num_examples: size of the split
    (default: the config default, e.g. 20000 train / 500 test; all rows for math_jsonl). knobs:
    the task's other config fields (see TASKS[name].knobs()), e.g. digits=3, ops="+-" for
    arithmetic; manual_dir=DIR for math_jsonl. Only the requested split is built.
    """
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known tasks: {sorted(TASKS)}")
    if split not in _SPLITS:
        raise ValueError(f"split must be one of {_SPLITS}, got {split!r}")
    if data_dir is None or not os.fspath(data_dir):
        raise ValueError("load_task needs data_dir=... (where built datasets are cached)")
    cls = TASKS[name]
    sizes = set(cls.NUM_EXAMPLES_FIELD.values())
    if sizes & set(knobs):
        raise ValueError(
            f"load_task: pass num_examples=... instead of {sorted(sizes & set(knobs))}"
        )
    knobs = dict(knobs, seed=seed)
    if num_examples is not None:
        if num_examples <= 0:
            raise ValueError(f"num_examples must be positive, got {num_examples}")
        knobs[cls.NUM_EXAMPLES_FIELD[split]] = int(num_examples)
    # One split per config: the other split has size 0 and is not built. Splits are
    # prefix-stable and held-out disjoint by construction, so nothing is lost.
    other = "test" if split == "train" else "train"
    knobs[cls.NUM_EXAMPLES_FIELD[other]] = 0
    if cls is MathJsonl:
        d = _check_manual_dir(os.fspath(knobs.get("manual_dir") or ""))
        knobs["manual_dir"] = os.path.abspath(d)
        wanted = knobs.get(f"{split}_file", getattr(MathJsonlConfig, f"{split}_file"))
        if not os.path.isfile(os.path.join(d, wanted)):
            raise ValueError(
                f"math_jsonl: no {split} file {os.path.join(d, wanted)!r}; put it in manual_dir "
                f"or set {split}_file=..."
            )
        knobs["content_hash"] = _hash_files(d, [wanted])
    config = cls.make_config(**knobs)
    download_config = None
    if cls is MathJsonl:
        download_config = tfds.download.DownloadConfig(manual_dir=config.manual_dir)
    # Runs of a sweep may start side by side: one builds, the others wait and then reuse it.
    os.makedirs(data_dir, exist_ok=True)
    lock_path = os.path.join(os.fspath(data_dir), f".{name}-{config.name}.lock")
    with open(lock_path, "w") as lock, _no_progress_bar():
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            builder = cls(config=config, data_dir=os.fspath(data_dir), file_format="array_record")
            builder.download_and_prepare(download_config=download_config)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    if split not in builder.info.splits:
        raise ValueError(
            f"{name}: split {split!r} was not built (available: {list(builder.info.splits)})"
        )
    return TaskSource(builder.as_data_source(split=split), task=name, split=split, config=config)
