"""The shipped traffic_profiles/: the Azure samples intact, each synthetic file reproducible from the
exact command its README gives, small, and loadable."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pandas as pd
import pytest

from tuner.cli import main
from tuner.traffic import describe, import_azure, read_traffic

ROOT = Path(__file__).resolve().parents[1]
PROFILES = ROOT / "traffic_profiles"
README = (PROFILES / "README.md").read_text()
COMMANDS = [line for line in README.splitlines() if line.startswith("tuner traffic ")]


# What the Azure sources hold (measured on the published files, data/AzureLLMInferenceTrace_{code,conv}.csv,
# once: the tests read nothing outside the repository): requests, first and last TIMESTAMP in ns since
# the epoch, and the sums of ContextTokens and GeneratedTokens.
SOURCES = {
    "azure_llm_2023_code.csv": (8819, 1700158623979960000, 1700162059928016000, 18059974, 245896),
    "azure_llm_2023_conv.csv": (19366, 1700158546680590000, 1700162048402527000, 22361870, 4088665),
}


@pytest.mark.parametrize("shipped", sorted(SOURCES))
def test_azure_samples_hold_the_sources_requests_timestamps_and_tokens(shipped):
    count, first_ns, last_ns, context, generated = SOURCES[shipped]
    df = read_traffic(PROFILES / shipped)
    assert len(df) == count
    assert list(df.columns) == ["timestamp", "batch_size", "seq_len", "prompt_tokens", "output_tokens"]
    # float64 seconds near 1.7e9 resolve about 0.24 us; the source has 0.1 us digits
    for got, want in ((df["timestamp"].iloc[0], first_ns), (df["timestamp"].iloc[-1], last_ns)):
        assert abs(got * 1e9 - want) < 300, (got, want)
    assert int(df["seq_len"].sum()) == context and (df["prompt_tokens"] == df["seq_len"]).all()
    assert int(df["output_tokens"].sum()) == generated
    assert "CC-BY 4.0" in README and "Splitwise" in README and "Creative Commons Attribution 4.0" in README


def test_readme_says_what_became_of_every_column_of_the_azure_samples():
    """The conversion the README describes names each column the shipped Azure files carry (it once
    said GeneratedTokens was left out, while the files carry it as output_tokens)."""
    conversion = README.split("## The Azure LLM inference trace 2023")[1].split("Attribution")[0]
    for shipped in SOURCES:
        for column in read_traffic(PROFILES / shipped).columns:
            assert f"`{column}`" in conversion, column
    assert "left out" not in conversion


def test_the_azure_importer_reads_the_published_format_into_the_shipped_table(tmp_path):
    """The published CSV's columns and timestamp format, made here from the shipped sample's first rows,
    come back as those rows."""
    shipped = read_traffic(PROFILES / "azure_llm_2023_code.csv").head(50)
    stamps = pd.to_datetime((shipped["timestamp"] * 1e9).round(-2).astype("int64"), utc=True)
    raw = pd.DataFrame({"TIMESTAMP": stamps.dt.strftime("%Y-%m-%d %H:%M:%S.%f0"),
                        "ContextTokens": shipped["seq_len"], "GeneratedTokens": shipped["output_tokens"]})
    raw.to_csv(tmp_path / "AzureLLMInferenceTrace_code.csv", index=False)
    back = import_azure(tmp_path / "AzureLLMInferenceTrace_code.csv")
    assert list(back.columns) == list(shipped.columns) and len(back) == 50
    assert (back["timestamp"] - shipped["timestamp"]).abs().max() < 1e-6
    assert back["seq_len"].tolist() == shipped["seq_len"].tolist()
    assert back["output_tokens"].tolist() == shipped["output_tokens"].tolist()


def test_readme_lists_a_command_for_every_shipped_profile():
    shipped = {p.name for p in PROFILES.iterdir() if p.suffix in (".csv", ".parquet")}
    made = {Path(shlex.split(c)[shlex.split(c).index("-o") + 1]).name for c in COMMANDS}
    assert shipped == made
    assert any("bursty_60s.csv" in c for c in COMMANDS)


# the Azure imports read the published files, which are not in the repository (their facts are checked above)
REPRODUCIBLE = [c for c in COMMANDS if not c.startswith("tuner traffic import azure ")]


@pytest.mark.parametrize("command", REPRODUCIBLE, ids=[re.sub(r" --force$", "", re.sub(r".* -o ", "", c))
                                                      for c in REPRODUCIBLE])
def test_each_profile_is_reproduced_byte_for_byte_by_its_readme_command(command, tmp_path, capsys):
    argv = shlex.split(command)[1:]
    target = Path(argv[argv.index("-o") + 1])
    argv[argv.index("-o") + 1] = str(tmp_path / target.name)
    assert main(argv) == 0
    assert (tmp_path / target.name).read_bytes() == (ROOT / target).read_bytes()
    assert (ROOT / target).stat().st_size < 2_000_000


def test_bursty_profile_is_bursty_and_has_seq_len():
    df = read_traffic(PROFILES / "bursty_60s.csv")
    stats = describe(df)
    assert 140 <= stats["mean_rps"] <= 160
    assert stats["interarrival_cv"] > 2
    assert df["seq_len"].max() <= 512 and 180 <= df["seq_len"].median() <= 220
    assert 55 <= stats["duration_s"] <= 60
