"""Pure: the sbatch option table and tokenizer, now in `shared.sbatch_options` so the
CLI reads the same table without importing a service; re-exported here for admission."""

from shared.sbatch_options import (
    BY_LONG,
    BY_SHORT,
    MUSTER_ONLY,
    TABLE,
    Arg,
    Given,
    Problem,
    Spec,
    Tokens,
    lookup_long,
    tokenize,
)

__all__ = [
    "BY_LONG",
    "BY_SHORT",
    "MUSTER_ONLY",
    "TABLE",
    "Arg",
    "Given",
    "Problem",
    "Spec",
    "Tokens",
    "lookup_long",
    "tokenize",
]
