"""`tuner.simulate.read_profile`: a profile measured on another model is refused when the caller names
the model it is for."""

from __future__ import annotations

import pytest

from tuner.errors import ProfileError
from tuner.simulate import Profile, ProfilePoint, read_profile, write_profile


def _profile(tmp_path, model: str):
    points = (ProfilePoint(1, 128, 1.0, 1.0, 1.0, 1), ProfilePoint(8, 128, 2.0, 2.0, 2.0, 1))
    return write_profile(Profile(points=points, model=model), tmp_path / "profile.csv")


def test_a_profile_of_another_model_is_refused_naming_both(tmp_path):
    path = _profile(tmp_path, "matmul_cpu")
    assert "# model: matmul_cpu" in path.read_text()
    with pytest.raises(ProfileError) as exc:
        read_profile(path, model="encoder_sim")
    assert str(exc.value) == f"{path}: measured on model matmul_cpu, not encoder_sim"


def test_a_profile_of_the_model_or_of_no_named_model_is_read(tmp_path):
    assert read_profile(_profile(tmp_path, "encoder_sim"), model="encoder_sim").model == "encoder_sim"
    unnamed = _profile(tmp_path, "")  # an older profile says nothing of its model: taken as it is
    assert read_profile(unnamed, model="encoder_sim").model == ""
    assert read_profile(_profile(tmp_path, "matmul_cpu")).model == "matmul_cpu"  # no model asked: any


# --- the memory limit per measured length; the per-request host cost ----------------------------------


def _measured(**settings) -> Profile:
    """Ran: up to 64 rows at length 32, 24 at 128, 8 at 512; failed: 25 at 128, 9 at 512."""
    points = [ProfilePoint(r, n, r * n / 16, r * n / 16, r * n / 16, 1)
              for n, top in ((32, 64), (128, 24), (512, 8)) for r in (1, 2, 4, 8, 16, 24, 32, 48, 64) if r <= top]
    return Profile(points=tuple(points), oom_rows=((512, 9), (128, 25)), **settings)


def test_out_of_memory_is_decided_by_the_limit_of_the_nearest_measured_lengths():
    p = _measured()
    assert p.oom_rows == ((128, 25), (512, 9))  # kept sorted by length
    # at a measured length: its own limit, not one token count found at the longest
    assert not p.fails(64, 32)  # 2048 tokens ran at length 32, although 9 x 512 = 4608 failed
    assert not p.fails(24, 128) and p.fails(25, 128)
    assert not p.fails(8, 512) and p.fails(9, 512)
    # between two lengths: the smaller of their limits (the longer one's)
    assert p.rows_limit(300) == 9 and p.fails(9, 300) and not p.fails(8, 300)
    assert p.rows_limit(64) == 25 and p.fails(25, 64) and not p.fails(24, 64)
    # below the shortest length: its limit (none failed there); beyond the longest: its padded tokens too
    assert not p.fails(64, 16)
    assert p.rows_limit(1024) == 5 and p.fails(5, 1024) and not p.fails(4, 1024)
    # the model's truncation applies first: at 512 tokens a longer input is a 512-token one
    truncated = _measured(max_length=512)
    assert truncated.rows_limit(4096) == 9 and not truncated.fails(8, 4096)
    # no limit seen: nothing fails; an older profile's token limit still holds at every length
    assert not Profile(points=(ProfilePoint(1, 8, 1.0, 1.0, 1.0, 1),)).fails(10_000, 8)
    older = Profile(points=(ProfilePoint(1, 8, 1.0, 1.0, 1.0, 1),), oom_tokens=100)
    assert older.fails(13, 8) and not older.fails(12, 8)


def test_the_new_keys_round_trip_and_an_older_file_reads_without_them(tmp_path):
    p = _measured(host_ms_per_request=0.035, host_ms_per_row=0.01, oom_ms=2.0, device_overlap=0.2)
    path = write_profile(p, tmp_path / "p.csv")
    text = path.read_text()
    assert "# host_ms_per_request: 0.035\n" in text and "# oom_rows: 128:25, 512:9\n" in text
    assert "# device_overlap: 0.2\n" in text and "20% of device time overlapping" in p.describe()
    assert read_profile(path) == p
    older = tmp_path / "older.csv"
    older.write_text("# tuner profile v1\n# host_ms_per_row: 0.1\n# oom_tokens: 4608\nrows,length,median_ms\n"
                     "1,512,2.0\n8,512,9.0\n")
    back = read_profile(older)
    assert back.host_ms_per_request == 0 and back.oom_rows == () and back.oom_tokens == 4608
    assert back.device_overlap == 0 and "overlapping" not in back.describe()


@pytest.mark.parametrize("header, message", [
    ("# oom_rows: 512-9", r"oom_rows: expected length:rows pairs .*got '512-9'"),
    ("# oom_rows: 512:0", r"oom_rows: lengths and rows must be >= 1, got 512:0"),
    ("# oom_rows: 512:9, 512:12", r"oom_rows: one limit per length"),
    ("# oom_rows: 512:8", r"point 2 \(rows=8, length=512\) is at or above the 8 rows that failed at length 512"),
    ("# host_ms_per_request: -1", r"host_ms_per_request must be a number >= 0, got -1"),
    ("# device_overlap: 1", r"device_overlap must be a number >= 0 and < 1, got 1"),
])
def test_bad_limits_and_costs_are_refused_in_one_line(tmp_path, header, message):
    path = tmp_path / "p.csv"
    path.write_text(f"{header}\nrows,length,median_ms\n1,512,2.0\n8,512,9.0\n")
    with pytest.raises(ProfileError, match=message):
        read_profile(path)
