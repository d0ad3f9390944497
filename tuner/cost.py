"""What one server costs per hour: a shipped price table (tuner/data/prices.yaml), overridable.

`price_for(cost_settings)` resolves the study's `cost` section to a `Price`: an explicit
`price_per_hour` wins (the user's own figure for one server: no instance, source and date of the
table's; `gpu` is the GPU the study names beside it, or None; `gpus_per_server` beside it is refused,
as it could be meant either way); otherwise the table's figure for one `gpu` on `cloud` (default: the
cheapest cloud listed) times `gpus_per_server`. `gpu: cpu`, the default, is the embedded default's CPU
instance, one server's price (`gpus_per_server` beside it is refused).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import yaml

from tuner.errors import SettingsError, did_you_mean
from tuner.settings import CostSettings

HOURS_PER_MONTH = 730.0  # 365 * 24 / 12, the figure cloud bills use
OWN_PRICE_SOURCE = "price_per_hour in the study"


@dataclass(frozen=True, kw_only=True)
class Price:
    """One server's price per hour and where it comes from (the table's entry, or the study's own)."""

    price_per_hour: float  # one server: per-GPU price x gpus_per_server
    gpu: str | None  # None: a price of the user's own, with no GPU named beside it
    cloud: str | None
    gpus_per_server: int
    instance: str
    source: str
    read: str
    estimate: bool

    def describe(self) -> str:
        """One line for a person: the price and what it is the price of."""
        if self.source == OWN_PRICE_SOURCE:
            return f"{self.price_per_hour:g} $/h (cost.price_per_hour: one server)"
        n = self.gpus_per_server
        what = "cost.gpu cpu, the default" if self.gpu == "cpu" else f"cost.gpu {self.gpu} on {self.cloud}"
        each = "" if n == 1 else f", {n} x {self.price_per_hour / n:g} $/h"
        return f"{self.price_per_hour:g} $/h ({what}{each}: {self.instance}; price table read {self.read}, {self.source})"

    def as_dict(self) -> dict:
        """The fields as a plain dict (summary.json's `price` block)."""
        return dict(self.__dict__)


@lru_cache(maxsize=1)
def price_table() -> dict:
    """The shipped price table (tuner/data/prices.yaml), read once."""
    text = resources.files("tuner").joinpath("data/prices.yaml").read_text()
    return yaml.safe_load(text)


def gpu_names() -> list[str]:
    """The GPU names `cost.gpu` accepts: `cpu` and every GPU of the price table."""
    return ["cpu", *price_table()["gpus"]]


def price_for(cost: CostSettings, *, source: str = "") -> Price:
    """One server's price under the study's `cost` section (see the module doc for the rules); a
    SettingsError names the study file `source` first, as every other error of its settings does."""
    try:
        return _price(cost)
    except SettingsError as exc:
        if not source:
            raise
        raise SettingsError(f"{source}: {exc}") from None


def _price(cost: CostSettings) -> Price:
    n = cost.gpus_per_server
    if cost.price_per_hour is not None:
        if n != 1:  # which one it is, a GPU's or the server's, cannot be told: say it rather than guess
            raise SettingsError("cost.gpus_per_server multiplies the price table's price of one GPU; with "
                                "cost.price_per_hour give the whole server's price and leave gpus_per_server out")
        # `gpu` defaults to "cpu": beside a price of the user's own it names nothing the user said
        gpu = None if cost.gpu.lower() == "cpu" else cost.gpu.lower()
        return Price(price_per_hour=cost.price_per_hour, gpu=gpu, cloud=cost.cloud, gpus_per_server=n, instance="custom", source=OWN_PRICE_SOURCE, read="", estimate=False)
    table = price_table()
    gpu = cost.gpu.lower()
    if gpu == "cpu":
        if n != 1:  # a CPU instance's price is the whole server's: doubling it for GPUs it has not is a guess
            raise SettingsError(f"cost.gpus_per_server: {n} GPUs on cost.gpu cpu (the default, a CPU instance's "
                                f"price): name the GPU in cost.gpu, or leave gpus_per_server out")
        entry = table["cpu"]["default"]
        if cost.cloud is not None and cost.cloud.lower() != entry["cloud"]:
            raise SettingsError(f"cost.cloud: {cost.cloud} beside cost.gpu cpu: the CPU price is one instance's, "
                                f"{entry['instance']}; give that cloud's price in cost.price_per_hour")
        return Price(price_per_hour=entry["price_per_hour"] * n, gpu="cpu", cloud=None, gpus_per_server=n, instance=entry["instance"], source=entry["source"],
                     read=str(entry["read"]), estimate=bool(entry["estimate"]))
    if gpu not in table["gpus"]:
        hint = did_you_mean(cost.gpu, gpu_names())
        raise SettingsError(f"cost.gpu: unknown GPU {cost.gpu!r} ({hint + ' ' if hint else ''}expected one of: "
                            f"{', '.join(gpu_names())}; or give cost.price_per_hour)")
    clouds = table["gpus"][gpu]
    if cost.cloud is None:  # the cheapest cloud that sells this GPU: another part standing in for it is not
        cloud = min([c for c in clouds if not clouds[c].get("stand_in")] or clouds,
                    key=lambda c: clouds[c]["price_per_hour"])
    elif cost.cloud.lower() in clouds:
        cloud = cost.cloud.lower()
    else:
        hint = did_you_mean(cost.cloud, clouds)
        raise SettingsError(f"cost.cloud: unknown cloud {cost.cloud!r} for {gpu} "
                            f"({hint + ' ' if hint else ''}expected one of: {', '.join(clouds)})")
    entry = clouds[cloud]
    return Price(price_per_hour=entry["price_per_hour"] * n, gpu=gpu, cloud=cloud, gpus_per_server=n, instance=entry["instance"], source=entry["source"],
                 read=str(entry["read"]), estimate=bool(entry["estimate"]))
