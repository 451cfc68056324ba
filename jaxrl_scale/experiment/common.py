"""Task loading shared by the SFT warm-start and RL runs (they must see the same task), and
the atomic JSON write every run, sweep and cache file goes through."""
from __future__ import annotations

import os

from jaxrl_scale.numbers import write_json  # noqa: F401  (the one atomic JSON writer)


def load_splits(task: str, task_kwargs: dict, data_dir: str, num_train: int = 0,
                num_test: int = 0):
    """(train, test) data sources. The dataset seed is task_kwargs.get("seed", 0), not the run
    seed: every run of a sweep sees the same problems (in a seed-dependent order)."""
    from jaxrl_scale.data import load_task
    kw = dict(task_kwargs)
    seed = int(kw.pop("seed", 0))
    data_dir = os.path.expanduser(data_dir)
    train = load_task(task, "train", data_dir=data_dir, seed=seed,
                      num_examples=num_train or None, **kw)
    test = load_task(task, "test", data_dir=data_dir, seed=seed,
                     num_examples=num_test or None, **kw)
    return train, test


def prompt_length(tokenizer, sources, max_prompt_len: int, context: int) -> int:
    """Token length every prompt is left-padded to.

    max_prompt_len = 0 picks the longest prompt in `sources` (not rounded up: every padded
    position costs the update and the prefill as much as a real token); a positive value is
    checked against every prompt: a ConfigError naming max_prompt_len and the longest prompt
    when one is longer. Either way the result must fit the model context (`context` tokens,
    checked by the caller with max_new_tokens). Needs only the tokenizer and the data, so it
    runs before the model loads.
    """
    from jaxrl_scale.experiment.errors import ConfigError
    longest, where = 0, None
    for name, src in sources:
        for i in range(len(src)):
            n = len(tokenizer.encode_prompt(src[i]["prompt"]))
            if n > longest:
                longest, where = n, (name, i)
    if max_prompt_len <= 0:
        return longest
    if longest > max_prompt_len:
        raise ConfigError("max_prompt_len", f"{max_prompt_len} is shorter than the longest "
                          f"prompt, {longest} tokens ({where[0]} example {where[1]})",
                          f"set --max_prompt_len >= {longest} (or 0: the longest prompt); "
                          f"the model context is {context} tokens")
    return max_prompt_len


def check_answer_room(tokenizer, sources, max_new_tokens: int) -> None:
    """ConfigError naming max_new_tokens when a response of `max_new_tokens` tokens cannot hold
    some example's answer (its token count under `tokenizer`): for a reward that compares the
    response's text with the answer (exact match), such an example scores 0 whatever the
    policy does, and a run where no answer fits trains on reward 0 to the end."""
    from jaxrl_scale.experiment.config import ConfigError
    longest, where = 0, None
    for name, src in sources:
        for i in range(len(src)):
            n = len(tokenizer.encode(str(src[i]["answer"])))
            if n > longest:
                longest, where = n, (name, i, src[i]["answer"])
    if longest > max_new_tokens:
        raise ConfigError("max_new_tokens", f"{max_new_tokens} token(s) cannot hold the task's "
                          f"answers: {where[0]} example {where[1]}'s answer {where[2]!r} is "
                          f"{longest} tokens", f"set --max_new_tokens >= {longest}")
