"""Environments of tests/test_env.py that run under either isolation: a worker process loads
its environment by name (--env_isolation=process), so they live in this light module, which a
worker imports in milliseconds (test_env.py itself imports JAX)."""
import os
import subprocess
import sys
import threading
import time

OBS = "wrong, try again"   # every test's observation: the retry example's (one feed shape)
RELEASE = threading.Event()


def first_char(text, example):
    """A reward that varies between samples (so GRPO's advantages are not all 0)."""
    return float(len(text) > 0 and text[0] in "0123456789+-=")


class OneTurn:
    """Done after the first assistant turn, rewarded by `first_char`: today's single-turn
    rollout as an environment."""

    def __init__(self, example):
        self.example = example

    def reset(self):
        return self.example["prompt"]

    def step(self, text):
        return "", first_char(text, self.example), True


class Broken:
    """Behaviour by the example's "kind"; "ok" is a well-behaved two-turn episode. With a
    "pid_dir" in the example, each episode writes its process id to pid_dir/<kind> ("sleeps"
    also that of the process it starts, to pid_dir/sleeps_child)."""

    def __init__(self, example):
        self.kind, self.n = example["kind"], 0
        self.pid_dir = example.get("pid_dir")
        self._note(self.kind, os.getpid())
        if self.kind == "init_raises":
            raise RuntimeError("cannot build")

    def reset(self):
        if self.kind == "reset_type":
            return 42
        return "1+1="

    def step(self, text):
        self.n += 1
        kind = self.kind if self.n >= 2 or self.kind == "raises" else "ok"
        if kind == "raises":
            raise ValueError("bad step")
        if kind == "hangs":
            RELEASE.wait(60)
        if kind == "sleeps":   # and so does a process it started
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1e6)"])
            self._note("sleeps_child", child.pid)
            time.sleep(1e6)
        if kind == "exits":
            os._exit(1)
        if kind == "wrong_types":
            return 1.0, "obs", None
        if kind == "nan_reward":
            return "", float("nan"), True
        if kind == "huge":
            return "x" * 100_000, 0.0, False
        if kind == "long_obs":
            return "y" * 17, 0.0, False
        return OBS, 0.5, self.n >= 3

    def _note(self, name, pid):
        if self.pid_dir:
            with open(os.path.join(self.pid_dir, name), "w") as f:
                f.write(str(pid))


class Echo:
    """A well-behaved environment whose episodes differ: reward 1 for a turn whose first
    character has an odd code (about half of a random model's turns), done at the first
    rewarded turn (or the third), OBS in between."""

    def __init__(self, example):
        self.example, self.n = example, 0

    def reset(self):
        return self.example["prompt"]

    def step(self, text):
        self.n += 1
        r = float(len(text) > 0 and ord(text[0]) % 2 == 1)
        return OBS, r, r > 0 or self.n >= 3


class Talk:
    """`obs` and reward 1 after each assistant turn, done after the example's "turns" (3)."""

    obs = OBS

    def __init__(self, example):
        self.example, self.n = example, 0

    def reset(self):
        return self.example["prompt"]

    def step(self, text):
        self.n += 1
        return self.obs, 1.0, self.n >= self.example.get("turns", 3)


def alive(pid):
    """Whether process `pid` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:   # gone meanwhile, or no /proc
        return True
