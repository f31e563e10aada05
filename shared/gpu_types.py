"""Pure: GPU type names, the short names Slurm users write (`--gres=gpu:h100:4`).

A node's GPUs carry a model, the NVML name ("NVIDIA H100 80GB HBM3"), and a short
type derived from it the way Slurm's `AutoDetect=nvml` names GRES types: lower case,
the product part only ("h100"), or set per node set in the cluster config. A request
names either, in any case.
"""

from __future__ import annotations

import re

# Words that name the vendor or a product line, not the GPU: dropped from the front.
_VENDOR = frozenset({"nvidia", "tesla", "geforce", "quadro", "amd", "instinct", "radeon", "sim"})
_WORD = re.compile(r"[a-z0-9]+")


def gpu_type(model: str) -> str:
    """ "NVIDIA H100 80GB HBM3" -> "h100", "Tesla V100-SXM2-16GB" -> "v100",
    "SIM-H100" -> "h100", "NVIDIA GeForce RTX 4090" -> "rtx4090"; "" for ""."""
    words: list[str] = _WORD.findall(model.lower())
    while len(words) > 1 and words[0] in _VENDOR:
        words = words[1:]
    if not words:
        return ""
    first = words[0]
    if first in ("rtx", "gtx") and len(words) > 1:
        # "RTX A6000" is the A6000; "RTX 4090" is the rtx4090.
        return words[1] if words[1][:1].isalpha() else first + words[1]
    return first


def gpu_matches(wanted: str, model: str | None, type_: str | None = None) -> bool:
    """Whether a request's GPU name names this GPU: its type, or its model written as a
    GRES type can be (no spaces: "nvidia_h100_80gb_hbm3", or without the vendor)."""
    if not model and not type_:
        return False
    want = _spelt(wanted)
    kind = _spelt(type_ or gpu_type(model or ""))
    full = _spelt(model or "")
    words = full.split("_")
    while len(words) > 1 and words[0] in _VENDOR:
        words = words[1:]
    return want in (kind, full, "_".join(words))


def _spelt(name: str) -> str:
    return "_".join(_WORD.findall(name.lower()))


def type_of(model: str | None, configured: str | None = None) -> str:
    """The type a GPU goes by: the configured one, else the one its model gives."""
    return (configured or gpu_type(model or "")).lower()
