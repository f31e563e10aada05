"""Contracts: the fair-share and priority configuration (one frozen Struct, decoded once).

The shell reads it (from a TOML file or `MUSTER_*` variables, in `__main__`) and passes
it down; the pure cores take its parts. Unknown keys are refused, so a typo in a config
file is an error rather than a silently ignored setting.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from services.fairshare.core import FairShareAlgorithm, ShareOptions
from services.fairshare.decay import HALF_LIFE_DEFAULT_S, ResetPeriod
from services.fairshare.priority import PriorityWeights

# The service's weights when none are configured: fair share dominates, age breaks ties
# between equals, partition and QOS lift what the operator says is urgent.
SERVICE_WEIGHTS = PriorityWeights(age=1000, fairshare=10000, partition=1000, qos=1000)


class FairShareConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """All knobs of the fairshare service; defaults follow Slurm's."""

    algorithm: FairShareAlgorithm = FairShareAlgorithm.FAIR_TREE
    dampening: Annotated[float, msgspec.Meta(gt=0)] = 1.0  # classic only
    half_life_s: Annotated[float, msgspec.Meta(ge=0)] = HALF_LIFE_DEFAULT_S  # 0 = no decay
    reset_period: ResetPeriod = ResetPeriod.NONE
    calc_period_s: Annotated[float, msgspec.Meta(gt=0)] = 300.0  # PriorityCalcPeriod, 5 min
    # pending jobs' priorities are recomputed this often, and soon after usage changes
    priority_period_s: Annotated[float, msgspec.Meta(gt=0)] = 5.0
    billing_weights: dict[str, float] = {}  # GPU model -> weight, default 1.0
    priority: PriorityWeights = SERVICE_WEIGHTS

    @property
    def share_options(self) -> ShareOptions:
        return ShareOptions(algorithm=self.algorithm, dampening=self.dampening)


def decode_config(data: bytes | str, *, toml: bool = True) -> FairShareConfig:
    """Decode and validate a config document (TOML by default, else JSON)."""
    if toml:
        return msgspec.toml.decode(data, type=FairShareConfig)
    return msgspec.json.decode(data, type=FairShareConfig)
