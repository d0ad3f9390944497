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
