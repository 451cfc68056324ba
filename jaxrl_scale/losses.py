"""Public loss and advantage functions; the implementations live in `jaxrl_scale.rl.losses`."""
from jaxrl_scale.rl.losses import *  # noqa: F401,F403
from jaxrl_scale.rl.losses import __all__  # noqa: F401
