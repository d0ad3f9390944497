"""The shipped price table and the study's overrides."""

from __future__ import annotations

import pytest

from tuner.cost import gpu_names, price_for, price_table
from tuner.errors import SettingsError
from tuner.settings import CostSettings

GPUS = ("t4", "l4", "a10g", "a100-40gb", "a100-80gb", "h100")
CLOUDS = ("aws", "gcp", "azure")


def test_table_covers_every_gpu_on_every_cloud_with_source_and_date():
    table = price_table()
    for gpu in GPUS:
        for cloud in CLOUDS:
            entry = table["gpus"][gpu][cloud]
            assert entry["price_per_hour"] > 0
            assert entry["source"].startswith("https://")
            assert entry["instance"] and entry["read"] and isinstance(entry["estimate"], bool)
    assert table["cpu"]["default"]["price_per_hour"] > 0
    assert set(GPUS) <= set(gpu_names())


def test_the_table_orders_gpus_as_the_market_does():
    aws = {g: price_table()["gpus"][g]["aws"]["price_per_hour"] for g in GPUS}
    assert aws["t4"] < aws["l4"] < aws["a10g"] < aws["a100-40gb"] < aws["a100-80gb"] < aws["h100"]


def test_price_for_a_gpu_picks_the_cloud_asked_or_the_cheapest():
    cheapest = price_for(CostSettings(gpu="h100"))
    assert cheapest.price_per_hour == min(e["price_per_hour"] for e in price_table()["gpus"]["h100"].values())
    gcp = price_for(CostSettings(gpu="H100", cloud="gcp", gpus_per_server=2))
    assert gcp.price_per_hour == pytest.approx(2 * price_table()["gpus"]["h100"]["gcp"]["price_per_hour"])
    assert gcp.cloud == "gcp" and gcp.gpus_per_server == 2
    # a cloud that does not sell the GPU lists another part standing in for it: never picked unasked
    a10g = price_for(CostSettings(gpu="a10g"))
    assert a10g.cloud == "aws" and a10g.price_per_hour == price_table()["gpus"]["a10g"]["aws"]["price_per_hour"]
    assert price_for(CostSettings(gpu="a10g", cloud="gcp")).instance.endswith("nearest part)")  # asked: given
    # the CPU default is one cloud's instance: another cloud named beside it is refused, not ignored
    with pytest.raises(SettingsError, match="cost.cloud: gcp"):
        price_for(CostSettings(cloud="gcp"))
    assert price_for(CostSettings(cloud="AWS")).gpu == "cpu"


def test_explicit_price_wins_and_cpu_is_the_default():
    assert price_for(CostSettings(gpu="t4", price_per_hour=0.1)).price_per_hour == 0.1
    cpu = price_for(CostSettings())
    assert cpu.gpu == "cpu" and cpu.price_per_hour == price_table()["cpu"]["default"]["price_per_hour"]


def test_unknown_gpu_or_cloud_is_named():
    with pytest.raises(SettingsError, match="cost.gpu: unknown GPU 'v100'"):
        price_for(CostSettings(gpu="v100"))
    with pytest.raises(SettingsError, match="cost.cloud: unknown cloud 'oracle'"):
        price_for(CostSettings(gpu="t4", cloud="oracle"))
    # named as every error of a study's settings is: the file first, then the nearest name
    with pytest.raises(SettingsError, match=r"^study.yaml: cost.gpu: unknown GPU 'h10' \(did you mean h100\? "):
        price_for(CostSettings(gpu="h10"), source="study.yaml")
    with pytest.raises(SettingsError, match=r"^study.yaml: cost.cloud: unknown cloud 'azzure' for t4 \(did you mean azure"):
        price_for(CostSettings(gpu="t4", cloud="azzure"), source="study.yaml")


def test_a_price_of_the_users_own_says_so():
    own = price_for(CostSettings(price_per_hour=2.5))
    assert own.price_per_hour == 2.5 and own.gpu is None and own.cloud is None
    assert own.source == "price_per_hour in the study" and own.instance == "custom" and not own.estimate
    assert own.as_dict()["price_per_hour"] == 2.5 and own.as_dict()["gpu"] is None
    # a GPU named beside the price is the user's label for it, kept
    named = price_for(CostSettings(gpu="A100-40GB", price_per_hour=2.5))
    assert named.gpu == "a100-40gb" and named.source == "price_per_hour in the study"


def test_gpus_per_server_on_the_cpu_default_is_refused_in_one_line():
    # the CPU instance's price was multiplied by GPUs it does not have
    with pytest.raises(SettingsError, match=r"^cost.gpus_per_server: 2 GPUs on cost.gpu cpu .*name the GPU"):
        price_for(CostSettings(gpus_per_server=2))
    assert price_for(CostSettings(gpus_per_server=1)).gpus_per_server == 1


def test_gpus_per_server_beside_a_price_of_the_users_own_is_refused_in_one_line():
    # the price could be one GPU's (to multiply) or the whole server's: it was silently taken as the server's
    with pytest.raises(SettingsError, match="with cost.price_per_hour give the whole server's price"):
        price_for(CostSettings(price_per_hour=3.4, gpus_per_server=2))
    assert price_for(CostSettings(price_per_hour=3.4, gpus_per_server=1)).price_per_hour == 3.4


def test_the_price_is_described_with_what_it_is_the_price_of():
    assert price_for(CostSettings()).describe().startswith(
        f"{price_table()['cpu']['default']['price_per_hour']:g} $/h (cost.gpu cpu, the default: ")
    per_gpu = price_table()["gpus"]["h100"]["gcp"]["price_per_hour"]
    two = price_for(CostSettings(gpu="h100", cloud="gcp", gpus_per_server=2)).describe()
    assert two.startswith(f"{2 * per_gpu:g} $/h (cost.gpu h100 on gcp, 2 x {per_gpu:g} $/h: ")
    assert price_for(CostSettings(price_per_hour=2.5)).describe() == "2.5 $/h (cost.price_per_hour: one server)"
