"""The SFT warm-start cache: builders that share it (job-array tasks, Ray workers, a rerun)
train an entry once and read it after."""
import time
from concurrent.futures import ThreadPoolExecutor

from jaxrl_scale.experiment import sft
from jaxrl_scale.experiment.sft import SFTConfig, sft_warmstart


def test_concurrent_builders_train_the_entry_once(tmp_path, monkeypatch):
    cfg = SFTConfig(model="tiny", num_train_examples=64, num_test_examples=16, batch_size=8,
                    max_steps=2, eval_every=1, eval_prompts=8, target_accuracy=1.0,
                    data_dir=str(tmp_path / "data"), cache_dir=str(tmp_path / "cache"))
    trained, real = [], sft._train

    def slow_train(*args, **kw):   # holds the entry while the other builder arrives
        trained.append(1)
        time.sleep(0.5)
        return real(*args, **kw)

    monkeypatch.setattr(sft, "_train", slow_train)
    with ThreadPoolExecutor(2) as ex:   # two builders: separate lock files, as two processes
        outs = list(ex.map(lambda _: sft_warmstart(cfg, progress=False), range(2)))
    assert len(trained) == 1
    assert outs[0] == outs[1] and outs[0][1]["steps"] == 2
    assert sft_warmstart(cfg, progress=False) == outs[0] and len(trained) == 1   # cached
    sft_warmstart(cfg, progress=False, force=True)
    assert len(trained) == 2
